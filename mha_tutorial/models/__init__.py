"""Tasks and tiny models: the transformer of notebook 05 and what trains it.

- ``blocks``, ``model``: embeddings, encoder and decoder blocks, ``ModelConfig`` and ``build_model``;
- ``task_base``, ``tasks``: the three toy tasks (reversal, induction, dates) and their shipped splits;
- ``train``: training, evaluation and the shipped checkpoints (``python -m mha_tutorial.models.train``).
"""
