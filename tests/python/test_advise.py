"""teraio advise: built-in models, the cached meta-device trace, and the
command end to end through teraio.advise.advise (docs/advise.md)."""
import json
import os

import pytest

from teraio import TeraioError
from teraio.advise import advise, build_model, models, trace
from teraio.core import Lifetime, Trace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H200 = os.path.join(ROOT, "hw", "h200-sxm.conf")
TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=256, tie_word_embeddings=False)


@pytest.fixture
def tiny_config(tmp_path):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(TINY, architectures=["LlamaForCausalLM"])))
    return str(d / "config.json")


# Parameter counts the models' own cards publish (Hugging Face model pages).
@pytest.mark.parametrize("name,params", [("gpt2", 124_439_808), ("qwen2.5-0.5b", 494_032_768),
                                         ("llama2-7b", 6_738_415_616),
                                         ("mistral-7b", 7_241_732_096),
                                         ("llama3-8b", 8_030_261_248)])
def test_built_in_models_have_their_published_parameter_counts(name, params):
    net = build_model(models()[name], "fp32", False)
    assert sum(p.numel() for p in net.parameters()) == params


def test_a_trace_is_cached_and_says_its_tokens(tiny_config, tmp_path):
    cache = str(tmp_path / "cache")
    path, tokens = trace(config=tiny_config, hw=H200, batch=2, seq=64, cache=cache)
    assert tokens == 128
    mtime = os.stat(path).st_mtime_ns
    again, _ = trace(config=tiny_config, hw=H200, batch=2, seq=64, cache=cache)
    assert again == path and os.stat(path).st_mtime_ns == mtime
    other, _ = trace(config=tiny_config, hw=H200, batch=2, seq=128, cache=cache)
    assert other != path
    t = Trace.load(path)
    assert "tokens=128" in t._p.contents.model.decode()
    kinds = {t.tensor_kind(i) for i in range(t.n_tensors)}
    assert {"parameter", "gradient", "optimizer_state", "activation"} <= kinds
    assert sorted(os.listdir(cache)) == sorted([os.path.basename(path), os.path.basename(other)])
    with open(path, "r+b") as f:  # a damaged cache entry is made again, not served
        f.truncate(500)
    again, _ = trace(config=tiny_config, hw=H200, batch=2, seq=64, cache=cache)
    assert again == path and Trace.load(path).n_kernels == t.n_kernels


def test_advise_answers_per_hardware_point(tiny_config, tmp_path):
    cache = str(tmp_path / "cache")
    path, _ = trace(config=tiny_config, hw=H200, batch=2, seq=64, cache=cache)
    lt = Lifetime(Trace.load(path))
    big, small = lt.peak_bytes * 2, (lt.floor_bytes + lt.peak_bytes) // 2
    svg = str(tmp_path / "advise.svg")
    doc = advise(config=tiny_config, hw=H200, batch=2, seq=64, cache=cache, gpus=[1, 2],
                 gpu_mem=[big, small], ssds="1-2", host_cap=[0], price_gpu_hour=2.0,
                 price_ssd=300, svg=svg)
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 2 and doc["tokens_per_gpu_iteration"] == 128
    one = [r for r in rows if r["gpus"] == 1]
    assert all(r["peak_bytes"] == lt.peak_bytes and r["floor_bytes"] == lt.floor_bytes for r in one)
    two = [r for r in rows if r["gpus"] == 2]
    assert all(r["peak_bytes"] < lt.peak_bytes for r in two)
    for r in rows:
        ideal, te = r["strategies"]["ideal"], r["strategies"]["teraio"]
        assert r["fits_without_offload"] == (r["peak_bytes"] <= r["gpu_mem_bytes"])
        assert ideal["tokens_per_s"] == pytest.approx(r["gpus"] * 128 / ideal["iteration_s"])
        hourly = r["gpus"] * (2.0 + r["ssds_per_gpu"] * 300 / (3 * 365 * 24))
        assert te["usd_per_mtoken"] == pytest.approx(hourly / (te["tokens_per_s"] * 3600) * 1e6)
        if r["fits_without_offload"]:
            assert te["share_of_ideal"] == 1.0 and r["teraio_bytes_to_ssd"] == 0
        else:
            assert r["fits"] and r["teraio_bytes_to_ssd"] > 0
        assert r["strategies"]["zero-offload"]["error"].startswith("needs ")
    s = doc["smallest"]
    assert s is not None and rows[s]["strategies"]["teraio"]["share_of_ideal"] >= 0.9
    smaller = [r for r in rows if r["fits"] and r["strategies"]["teraio"]["share_of_ideal"] >= 0.9
               and (r["gpus"], r["gpu_mem_bytes"], r["ssds_per_gpu"]) <
               (rows[s]["gpus"], rows[s]["gpu_mem_bytes"], rows[s]["ssds_per_gpu"])]
    assert smaller == []
    # 4 panels x 3 strategies: no host memory, so ZeRO-Offload has no line (and no legend)
    chart = open(svg).read()
    assert chart.count("<polyline") == 4 * 3 and ">zero-offload<" not in chart


def test_bf16_halves_the_bytes_and_checkpointing_drops_activations(tiny_config, tmp_path):
    cache = str(tmp_path / "cache")
    peaks, states = {}, {}
    for dtype, ckpt in (("fp32", False), ("bf16", False), ("fp32", True)):
        path, _ = trace(config=tiny_config, hw=H200, batch=8, seq=256, dtype=dtype,
                        checkpointing=ckpt, cache=cache)
        t = Trace.load(path)
        peaks[dtype, ckpt] = Lifetime(t).peak_bytes
        states[dtype, ckpt] = sum(t.tensor_bytes(i) for i in range(t.n_tensors)
                                  if t.tensor_kind(i) == "parameter")
    # Parameters (and AdamW's moments) are bf16; the loss still upcasts
    # the logits to fp32 (transformers' ForCausalLMLoss), so the peak drops less.
    # (within the 32 bytes of the rotary inv_freq buffer, which stays fp32)
    assert 0 <= states["fp32", False] - states["bf16", False] * 2 <= 32
    assert peaks["bf16", False] < 0.7 * peaks["fp32", False]
    assert peaks["fp32", True] < 0.8 * peaks["fp32", False]


def test_bad_input_is_one_clear_error(tiny_config, tmp_path):
    with pytest.raises(TeraioError, match="unknown model 'gpt5'"):
        advise("gpt5", hw=H200, cache=str(tmp_path))
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 64}')
    with pytest.raises(TeraioError, match="no \"model_type\""):
        advise(config=str(bad), hw=H200, cache=str(tmp_path))
    no16 = tmp_path / "no16.conf"
    no16.write_text("".join(line for line in open(H200) if "16bit" not in line))
    with pytest.raises(TeraioError, match="has no gpu_matmul_16bit_tflops"):
        advise(config=tiny_config, hw=str(no16), dtype="bf16", cache=str(tmp_path))
    with pytest.raises(TeraioError, match="cannot read|No such file"):
        advise(config=tiny_config, hw=str(tmp_path / "none.conf"))
    with pytest.raises(TeraioError, match="--ssds"):
        advise(config=tiny_config, hw=H200, ssds="0")
    odd = tmp_path / "odd" / "config.json"  # the model's own code refuses it: one line
    odd.parent.mkdir()
    odd.write_text(json.dumps(dict(TINY, hidden_size="abc")))
    with pytest.raises(TeraioError, match=r"^teraio advise: tracing .* failed: \w+"):
        advise(config=str(odd), hw=H200, cache=str(tmp_path))
    with pytest.raises(TeraioError, match="longer than .* 256 positions"):
        advise(config=tiny_config, hw=H200, seq=4096, cache=str(tmp_path))
    with pytest.raises(TeraioError, match="checkpointing must be True or False"):
        advise(config=tiny_config, hw=H200, checkpointing="no")
