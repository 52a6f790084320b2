"""After the search: confirmation, refinement and the never-worse check, measured end to end.
"""
