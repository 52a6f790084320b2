"""The Collage core: graphs, sub-graphs, rules, candidates, costs, targets, the search, pins,
plans and the transition model. Imports nothing else of the project.
"""
