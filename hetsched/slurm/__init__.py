"""Slurm adapter: the only code that talks to a Slurm cluster.

``runner`` runs commands, ``client`` wraps the Slurm CLI behind the
``SlurmClient`` protocol, ``inventory`` turns a partition into a
:class:`hetsched.core.spec.Cluster`, ``templates`` renders sbatch scripts,
``submit``/``monitor``/``replan`` are the use cases.
"""
