"""learned_optimization's public module tree, served by metafam.

Replace the import prefix ``learned_optimization`` with ``metafam.compat.learned_optimization``::

    from metafam.compat.learned_optimization.tasks import quadratics
    from metafam.compat.learned_optimization.outer_trainers import truncated_pes

Every class here is a thin layer of names, signatures and small adapters over metafam's own classes: the inner
training is `metafam.inner.TruncatedStep`, the estimators are `metafam.outer_trainers` estimators (subclassed only
to accept the reference library's constructor arguments), and single-machine meta-training runs
`metafam.outer_trainers.MetaTrainer`. What is covered, and where the numbers differ on purpose, is listed in
``COVERAGE.md`` next to this file.
"""
