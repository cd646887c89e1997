"""EXAONE 3 and InternLM3 under the transformers program: transformers 5.24 builds ``LlamaForCausalLM`` for both
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), so ``analytic.ops.transformers.PROGRAMS`` maps them onto the ``llama``
program, and here, as in tests/test_ops_transformers_llama.py, the predicted step equals transformers' own model
measured on meta, phase by phase, for B = 1, 2 and 3.  The configs are small config.json objects in each type's
own spelling (EXAONE's ``num_layers``, ``activation_function``; InternLM3's ``qkv_bias``, ``bias``)."""

import pytest

from lm_accounting.hf_config import config_from_hf, to_hf_dict
from lm_accounting.setup import TrainingSetup

pytest.importorskip("transformers")
from test_ops_transformers_llama import check

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
CONFIGS = {
    "exaone": {**SMALL, "num_layers": 3, "activation_function": "silu", "layer_norm_epsilon": 1e-5},
    "internlm3": {**SMALL, "num_hidden_layers": 3, "head_dim": 8, "qkv_bias": True, "bias": True},
}
SETUPS = [
    TrainingSetup(attention="sdpa", precision="bf16"),
    TrainingSetup(attention="naive", precision="fp32"),
    TrainingSetup(attention="naive", checkpoint="full"),
    TrainingSetup(attention="sdpa", precision="amp-bf16"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", CONFIGS)
@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: "-".join(s.to_dict().values()))
def test_llama_coded_types_equal_transformers_on_meta(model_type, setup):
    cfg = config_from_hf({"model_type": model_type, **CONFIGS[model_type]})
    assert to_hf_dict(cfg)["model_type"] == model_type  # measured as the type's own class, not as llama
    check(cfg, 12, setup)
