"""Public test helpers, as ``torch.testing`` has them: the offline fakes (:mod:`mcadvantage.testing.fakes`: tiny
tokenizers and models, toy samplers with exactly known values) and the estimator contract check
(:mod:`mcadvantage.testing.estimator_check`: :func:`check_advantage_estimator`). Import them from here."""

from mcadvantage.testing.estimator_check import (
    CONTRACT_RULES,
    EstimatorCheckReport,
    EstimatorContractError,
    check_advantage_estimator,
)
from mcadvantage.testing.estimator_check import (
    TINY_RUN_SETTINGS as TINY_RUN_SETTINGS,
)
from mcadvantage.testing.estimator_check import (
    chunk4 as chunk4,
)
from mcadvantage.testing.estimator_check import (
    vowel_share as vowel_share,
)
from mcadvantage.testing.fakes import (
    BOS_TOKEN as BOS_TOKEN,
)
from mcadvantage.testing.fakes import (
    DEFAULT_ALPHABET as DEFAULT_ALPHABET,
)
from mcadvantage.testing.fakes import (
    EOS_TOKEN as EOS_TOKEN,
)
from mcadvantage.testing.fakes import (
    IM_END as IM_END,
)
from mcadvantage.testing.fakes import (
    IM_START as IM_START,
)
from mcadvantage.testing.fakes import (
    PAD_TOKEN as PAD_TOKEN,
)
from mcadvantage.testing.fakes import (
    UNK_TOKEN as UNK_TOKEN,
)
from mcadvantage.testing.fakes import (
    FakeSampler,
    OutcomeReward,
    StepTreeSampler,
    TabularStepPolicy,
    build_char_tokenizer,
    build_tiny_llama,
    build_tool_calling_tokenizer,
    save_tiny_model,
)

# The documented names (docs/api.md); the constants and tiny-run helpers above import from here too.
__all__ = [
    "CONTRACT_RULES",
    "EstimatorCheckReport",
    "EstimatorContractError",
    "FakeSampler",
    "OutcomeReward",
    "StepTreeSampler",
    "TabularStepPolicy",
    "build_char_tokenizer",
    "build_tiny_llama",
    "build_tool_calling_tokenizer",
    "check_advantage_estimator",
    "save_tiny_model",
]
