"""The bottom layer: the value types and interfaces every part of edl shares.

Nothing here imports the rest of edl (only ``edl.errors``): the job spec (``spec``), data
positions (``data``), cluster snapshots, trainer pods and the cluster interfaces
(``cluster``), the master's API as its clients see it (``master``) and the scaling policy
interface (``policy``).
"""
