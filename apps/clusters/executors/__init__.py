"""Execution backends behind one interface (:mod:`.base`): local processes, Slurm, Kubernetes.

Nothing here imports Django; ``apps.clusters.backends`` builds executors from cluster rows.
"""
