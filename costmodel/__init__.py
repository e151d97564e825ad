"""Graph capture and costs: what a model computes and stores, and what a cluster can do.

costmodel knows nothing of choices: it describes operators, tensors, devices and links; the planner
decides. Public entry points are re-exported here.
"""
from partita.costmodel.errors import PartitaError, InfeasibleError
from partita.costmodel.fingerprint import model_fingerprint
from partita.costmodel.models import ModelSpec, resolve_model, PRESETS
