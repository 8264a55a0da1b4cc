"""The instruments: measurements of any PyTorch model through forward hooks on its blocks.

One hook machinery (:mod:`shapedtx.diagnostics.hooks`: find the blocks, run the model once
with hooks, restore the modules' modes, check that every block ran once) and one weight-update
meter (:mod:`shapedtx.diagnostics.updates`) carry the three instruments:

- :func:`probe` (:mod:`~shapedtx.diagnostics.probing`): the token covariance after every block
  as the library's covariance Dataset; :class:`CovarianceProbe`, its covariance metrics in a
  training loop (a :class:`Monitor` reduced to them);
- :class:`Monitor` (:mod:`~shapedtx.diagnostics.monitor`): signal propagation while a model
  trains (activations, covariance, attention through :mod:`~shapedtx.diagnostics.attention`,
  update sizes); ``shapedtx.train`` logs the same numbers;
- :func:`coord_check` (:mod:`~shapedtx.diagnostics.coordinates`): mup's coordinate check.

Layering: the core modules of ``shapedtx`` < ``shapedtx.diagnostics`` < ``shapedtx.training``
(``tests/test_layering.py``).
"""

from .attention import (
    ATTENTION_VARIABLES,
    HEAD_METRICS,
    AttentionEntry,
    Reader,
    attention_entropy,
    entropy_reference,
    find_attention,
    max_logit,
)
from .coordinates import (
    OPTIMIZERS,
    QUANTITIES,
    coord_check,
    default_group,
    plot_coord_check,
)
from .hooks import (
    BLOCK_PATHS,
    BlockHooks,
    Blocks,
    NamedBlocks,
    Streams,
    call_model,
    find_blocks,
    named_submodule,
    record_streams,
    residual_stream,
    run_once,
)
from .monitor import (
    LAYER_METRICS,
    PLOTTED,
    Monitor,
    activation_rms,
    excess_kurtosis,
    mlp_kappa,
    monitor_variables,
    plot_monitor,
)
from .probing import CovarianceProbe, probe
from .updates import GroupRule, UpdateMeter, matrix_name, relative_update

__all__ = [
    "ATTENTION_VARIABLES",
    "BLOCK_PATHS",
    "HEAD_METRICS",
    "LAYER_METRICS",
    "OPTIMIZERS",
    "PLOTTED",
    "QUANTITIES",
    "AttentionEntry",
    "BlockHooks",
    "Blocks",
    "CovarianceProbe",
    "GroupRule",
    "Monitor",
    "NamedBlocks",
    "Reader",
    "Streams",
    "UpdateMeter",
    "activation_rms",
    "attention_entropy",
    "call_model",
    "coord_check",
    "default_group",
    "entropy_reference",
    "excess_kurtosis",
    "find_attention",
    "find_blocks",
    "matrix_name",
    "max_logit",
    "mlp_kappa",
    "monitor_variables",
    "named_submodule",
    "plot_coord_check",
    "plot_monitor",
    "probe",
    "record_streams",
    "relative_update",
    "residual_stream",
    "run_once",
]
