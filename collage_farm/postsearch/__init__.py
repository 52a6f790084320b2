"""After the search of a measured campaign: confirmation, refinement and the never-worse check.

One module per step, each measured end to end on this machine:

* `collage_farm.postsearch.confirm`: re-measure the chosen path's candidates, search again;
* `collage_farm.postsearch.moves`: plans as (node set, target) parts, and their local moves;
* `collage_farm.postsearch.refine`: hill climbing over those moves, timed interleaved;
* `collage_farm.postsearch.noise`: when one interleaved timing beats another (round by round);
* `collage_farm.postsearch.never_worse`: plans against every single toolchain's whole model;
* `collage_farm.postsearch.decide`: `post_search`, which plan the campaign writes.

The package re-exports nothing: import from the module.
"""
