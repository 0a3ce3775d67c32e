"""Inspecting and pruning heads in trained models (notebooks 02, 06, 07).

- ``maps``, ``viz``, ``head_stats``: collecting attention maps, drawing per-head grids, naming what heads do;
- ``pruning``: head importance by ablation and by gradient, pruning curves;
- ``mask_viz``, ``mha_figures``: the figures of the masking and multi-head lessons.
"""
