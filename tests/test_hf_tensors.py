"""``analytic.hf_tensors`` against transformers' real model, for every supported model type (issue 30).

AdamW's step counters and its for-loop temporaries are per parameter tensor, so the list of transformers'
tensors must be exact: ``[p.numel() for p in model.parameters()]`` of ``AutoModelForCausalLM.from_config`` on
meta (transformers 5.24) equals ``hf_parameter_tensor_sizes`` of the same config.json read by ``config_from_hf``,
element by element (so order and count), untied and tied, for one config of each type in
``hf_config.SUPPORTED_MODEL_TYPES``: the small zoo configs of tests/test_hf_zoo.py and the published configs of
tests/test_transformers_truth.py and the architecture tests, with fewer layers where the layer count is a
plain field (``LAYER_FIELDS``).
"""

import pytest

from lm_accounting.analytic.hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes
from lm_accounting.hf_config import SUPPORTED_MODEL_TYPES, config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_arch_bloom import CONFIGS as BLOOM
from test_arch_dsa import TINY_CONFIGS as DSA
from test_arch_ernie4_5_moe import CONFIGS as ERNIE
from test_arch_lfm2 import TINY_CONFIGS as LFM2
from test_arch_llama4 import CONFIGS as LLAMA4
from test_arch_mamba import TINY_CONFIGS as SSM
from test_arch_mamba2 import TINY_CONFIGS as MAMBA2
from test_arch_olmo import CONFIGS as OLMO
from test_arch_parallel_block import CONFIGS as PARALLEL
from test_arch_qwen2_moe import CONFIGS as QWEN2_MOE
from test_arch_qwen3_next import QWEN3_5_MOE, QWEN3_5_TEXT, QWEN3_NEXT
from test_arch_relu import CONFIGS as RELU
from test_gpt_oss import CONFIGS as GPT_OSS
from test_hf_zoo import ZOO
from test_transformers_truth import CONFIGS as TRUTH
from test_transformers_truth import build_hf

LAYER_FIELDS = ("num_hidden_layers", "n_layer")
LISTS = ("layer_types", "mlp_layer_types", "moe_topk")  # per-layer lists: the layer count stays


def one_per_type() -> dict[str, dict]:
    """model_type -> the first config.json of that type among the test tables."""
    out: dict[str, dict] = {}
    tables = [
        [values for values, _ in TRUTH.values()],
        [{"model_type": t, **v} for t, v in ZOO.items()],
        [values for values, _ in [*BLOOM.values(), *GPT_OSS.values()]],
        [*OLMO.values(), *QWEN2_MOE.values(), *ERNIE.values(), *PARALLEL.values()],
        [QWEN3_NEXT, QWEN3_5_TEXT, QWEN3_5_MOE["text_config"]],  # the Gated DeltaNet hybrids' text models
        [*RELU.values()],  # OPT, Nemotron
        [*DSA.values()],  # DeepSeek-V3.2, GLM-5
        [*LLAMA4.values()],  # Llama 4's text model
        [*MAMBA2.values()],  # the Mamba2 hybrids: Nemotron-H, Bamba
        [*LFM2.values()],  # the short-convolution hybrids: LFM2, LFM2-MoE
        [*SSM.values()],  # the state-space models: Mamba2, Mamba, Falcon-Mamba
    ]
    for table in tables:
        for values in table:
            out.setdefault(values["model_type"], values)
    return out


def fewer_layers(values: dict, keep: int = 4) -> dict:
    if any(k in values for k in LISTS):
        return values
    return {k: min(v, keep) if k in LAYER_FIELDS else v for k, v in values.items()}


CASES = one_per_type()


def test_every_supported_type_has_a_case():
    assert set(CASES) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
@pytest.mark.parametrize("tied", [False, True])
def test_tensors_equal_transformers_model(model_type, tied):
    values = {**fewer_layers(CASES[model_type]), "tie_word_embeddings": tied}
    cfg = config_from_hf(values)
    real = [p.numel() for p in build_hf(values).parameters()]
    assert hf_parameter_tensor_sizes(cfg) == real
    assert hf_parameter_tensor_count(cfg) == len(real)


@pytest.mark.parametrize("name", PARALLEL)
def test_parallel_block_variants_equal_transformers_model(name):
    """Every parallel-block config (GPT-NeoX sequential, Falcon's block kinds, q/k norms of Cohere and Phi,
    StableLM's use_parallel_residual): the same comparison."""
    values = fewer_layers(PARALLEL[name])
    real = [p.numel() for p in build_hf(values).parameters()]
    assert hf_parameter_tensor_sizes(config_from_hf(values)) == real
