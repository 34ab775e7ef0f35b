"""agl-trainer: the training side of agl.

Everything that serves or trains lives here, outside the agent's process:

- :mod:`agl_trainer.store_server`: the store over HTTP (``agl store serve``);
- :mod:`agl_trainer.gateway`: the OpenAI-compatible gateway that records token ids;
- :mod:`agl_trainer.http`: the HTTP plumbing both servers share (body limits, SSE, a server thread);
- :mod:`agl_trainer.trainer`: the loop (rollouts → transitions → backend update);
- :mod:`agl_trainer.evaluation`: an agent run once per task on a base model or a checkpoint;
- :mod:`agl_trainer.cli`: the ``agl`` command.

.. code-block:: python

    from agl_trainer import Trainer

    Trainer({"steps": 20, "backend": {"name": "verl", "config": {...}}}).fit(agent, train_tasks, val_tasks)
"""

import agl.plugins
from agl_trainer.config import TrainerConfig
from agl_trainer.evaluation import evaluate
from agl_trainer.trainer import Trainer, TrainResult

__version__ = "0.1.0"

# agl-trainer's credit strategies and loggers are built in wherever the training side is imported.
agl.plugins.add_builtin("agl_trainer.credit")
agl.plugins.add_builtin("agl_trainer.loggers")

__all__ = ["TrainResult", "Trainer", "TrainerConfig", "evaluate"]
