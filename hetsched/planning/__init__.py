"""Planning: policies, evaluators and bounds for both sharing modes.

``space/`` (one job per GPU at a time, replanned at reset events) and
``pool/`` (Hare's task-level time sharing) each have an evaluator that turns
a policy's decisions into a :class:`~hetsched.core.plan.Plan`;
:func:`hetsched.planning.planner.make_plan` is the one entry point.
"""
