"""The embedding tables' vocabulary: the names a plan, the planner and the command line use for shardings,
placements, sparse optimizers and who prices the tables. Torch-free (costs.py and torchrec_costs.py need torch's
tables), so `partita plan --help` and a plan's validation read them without importing torch."""

SHARDINGS = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise")
PLACEMENTS = ("hbm", "cache", "host")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adam", "sgd")
PRICINGS = ("partita", "torchrec")
"""Who prices the table pieces: partita's byte model, or TorchRec's estimator (costmodel.sparse.torchrec_costs)."""
