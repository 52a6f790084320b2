"""Model-level probes the search needs before it runs: cut costs and transition costs.
"""
