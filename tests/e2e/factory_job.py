"""A user's training script (tests/rank_pool.py runs it as __main__ on 2 ranks): `partita.run` on the plan with the
same model factory the CLI takes as `examples.image_classifier:model` -- a function returning (module,
example_inputs, loss_fn) -- and the example's dataset object, under --verify's comparison. Rank 0 writes what it
got to OUT.

    factory_job.py OUT PLAN.json
"""
import json
import sys

import partita
from examples.image_classifier import dataset, model
from partita.runtime.launcher.mesh import init_default

init_default()
result = partita.run(sys.argv[2], model, dataset(), steps=3, lr=0.05, verify=True, sync_batchnorm=True,
                     print_report=False)
if result.verified is not None:  # rank 0 holds the report
    with open(sys.argv[1], "w") as f:
        json.dump({"verified": result.verified, "losses": result.losses, "reference": result.reference_losses}, f)
