"""Hostile input: every bad input gets exactly one line on stderr and exit code 2, never a
traceback, a hang or a memory blow-up, whether through the CLI or the Python API."""

import errno
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lm_accounting import AccountingError, ConfigError, ModelConfig, load_config
from lm_accounting.config import MAX_CONFIG_BYTES, check_positive_int, parse_override
from lm_accounting.measure import devices
from lm_accounting.measure.devices import check_live_run
from lm_accounting.output import safe_filename, write_with
from lm_accounting.sweep import MAX_POINTS, check_live_points, parse_contexts

BIG = "9" * 5000  # beyond int()'s 4,300-digit limit and the float range
TINY = dict(vocab_size=97, context_length=32, num_layers=2, d_model=16, num_heads=2, d_ff=32)
TINY_TOML = "vocab_size = 97\ncontext_length = 32\nnum_layers = {layers}\nd_model = 16\nnum_heads = 2\nd_ff = 32\n"


def one_line_error(code, err, needle=""):
    """Exit 2, exactly one line on stderr, the tool's prefix, no traceback, short."""
    lines = err.strip("\n").split("\n")
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("lm-account: error: "), err
    assert "Traceback" not in err and len(err) < 400, err
    assert needle in err, err


# Runs the command given after the file name and writes its own peak RSS (KiB) to that file.  A child's
# peak RSS starts at its parent's (fork/vfork; Linux keeps it across execve), and the test process may
# hold a gigabyte after the live runs: this small intermediate process is the CLI's parent instead.
_RSS_WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def cli(*args, timeout=120, cwd=None):
    """``lm-account ARGS`` in a fresh process: (exit code, stderr, peak RSS bytes of that process alone:
    ``RUSAGE_CHILDREN`` would be the largest child of the whole session).  ``timeout`` is a hang guard
    only: the work is bounded by the RSS, never by wall seconds on a shared machine."""
    with tempfile.TemporaryDirectory() as tmp:
        rss_file = os.path.join(tmp, "rss")
        proc = subprocess.run(
            [sys.executable, "-c", _RSS_WRAPPER, rss_file, sys.executable, "-m", "lm_accounting", *map(str, args)],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=cwd,
        )
        rss = int(Path(rss_file).read_text()) * 1024
    return proc.returncode, proc.stderr, rss


# ------------------------------------------------------------------ 1. integers of any length
@pytest.mark.parametrize(
    "args, needle",
    [
        (["gpt2-xl", "--set", f"num_layers={BIG}"], "(5,000 digits)"),
        (["gpt2-xl", "--set", f"rope_theta={BIG}"], "positive finite"),
        (["gpt2-xl", "--set", f"num_layers={'1' * 40}"], "digits) is beyond the supported 10^18"),
        (["gpt2-xl", "--set", "num_layers=10000000000000000000"], "1.000e+19 is beyond the supported 10^18"),
        (["sweep", "gpt2-small", "--contexts", BIG, "--no-plots"], "(5,000 digits)"),
        (["sweep", "gpt2-small", "--contexts", f"1:{BIG}:x2", "--no-plots"], "(5,000 digits)"),
        (["sweep", "gpt2-small", "--contexts", "128,10000000000000000000", "--no-plots"], "beyond the supported 10^18"),
        (["gpt2-xl", "--context", BIG], "beyond the supported 10^18"),
        (["gpt2-xl", "--layers", BIG], "beyond the supported 10^18"),
    ],
)
def test_long_integers_on_the_command_line(run_cli, args, needle):
    r = run_cli(*args)
    one_line_error(r.code, r.err, needle)


@pytest.mark.parametrize(
    "digits, needle", [(5000, "more than 4,300 digits"), (4000, "7.777e+3999 is beyond"), (400, "7.777e+399 is beyond")]
)
def test_long_integers_in_toml(run_cli, tmp_path, digits, needle):
    f = tmp_path / "big.toml"
    f.write_text(TINY_TOML.format(layers="7" * digits))
    r = run_cli(f)
    one_line_error(r.code, r.err, needle)


def test_long_integers_in_the_api():
    for value in (10**5000, -(10**5000), 10**19):
        with pytest.raises(ConfigError) as err:
            ModelConfig(**{**TINY, "num_layers": value})
        assert len(str(err.value)) < 120 and "num_layers" in str(err.value)
    with pytest.raises(ConfigError, match="positive finite"):
        ModelConfig(**{**TINY, "rope_theta": 10**400})  # float(10**400) overflows
    with pytest.raises(AccountingError, match=r"1\.000e\+5000 is beyond"):
        check_positive_int("batch", 10**5000)
    with pytest.raises(AccountingError, match=r"\(5,000 digits\)"):
        parse_contexts(BIG)
    with pytest.raises(ConfigError, match=r"\(5,000 digits\)"):
        parse_override(f"d_ff={BIG}")


# ------------------------------------------------------------------ 2. API types, keyword-only
WRONG = {
    "vocab_size": "97",
    "context_length": 32.0,
    "num_layers": True,
    "d_model": None,
    "num_heads": [2],
    "d_ff": 1.5,
    "num_kv_heads": "2",
    "head_dim": 8.0,
    "rope_theta": "1e4",
    "norm_eps": False,
    "tie_embeddings": 1,
    "qk_norm": "yes",
    "name": 7,
}


@pytest.mark.parametrize("field", sorted(WRONG))
def test_every_field_refuses_a_wrong_type(field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**{**TINY, field: WRONG[field]})


def test_model_config_is_keyword_only_and_names_are_plain():
    with pytest.raises(TypeError):
        ModelConfig(97, 32, 2, 16, 2, 32)  # positional: the point of the test
    for name in ("", "a\nb", "x\x1b[31m", "n" * 201):
        with pytest.raises(ConfigError, match="name"):
            ModelConfig(**TINY, name=name)


def test_load_config_takes_a_path_and_refuses_other_types(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text(TINY_TOML.format(layers=2))
    assert load_config(f) == load_config(str(f)) == ModelConfig(**TINY, name="tiny")
    for bad in (3, None, b"gpt2-xl", ["gpt2-xl"]):
        with pytest.raises(ConfigError, match="preset name or a path"):
            load_config(bad)


# ------------------------------------------------------------------ 3. preset name vs file path
def test_a_local_folder_never_replaces_a_preset(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2-xl").mkdir()  # a folder named like a preset
    (tmp_path / "gpt2-small").write_text(TINY_TOML.format(layers=2))  # a file named like one
    assert "2,127,057,600" in run_cli("gpt2-xl").out
    assert "190,460,160" in run_cli("gpt2-small").out  # the preset, not the local file
    r = run_cli("./gpt2-small", "--format", "json")  # a path: the file
    assert r.code == 0 and '"num_layers": 2' in r.out
    (tmp_path / "mine").write_text(TINY_TOML.format(layers=2))
    r = run_cli("account", "mine")
    one_line_error(r.code, r.err, "write it as a path: ./mine")
    one_line_error(*_ce(run_cli("mine")), "preset")  # the bare form (a possible subcommand) is refused too
    with pytest.raises(ConfigError, match="write it as a path: ./mine"):
        load_config("mine")
    assert run_cli("./mine").code == 0


# ------------------------------------------------------------------ 4. config paths that are not regular files
def test_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "model.toml"
    os.mkfifo(fifo)
    code, err, _ = cli(fifo)  # a read of the FIFO would block until the timeout
    one_line_error(code, err, "not a regular file (a FIFO)")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_devices_are_refused_unread(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    code, err, rss = cli(device)
    one_line_error(code, err, "a character device")
    assert rss < 1.5e9


def test_directory_missing_huge_and_unreadable(run_cli, tmp_path, monkeypatch):
    one_line_error(*_ce(run_cli(tmp_path)), "is a directory")
    one_line_error(*_ce(run_cli(tmp_path / "nope.toml")), "no such file")
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse: 1 MiB + 1 byte
    one_line_error(*_ce(run_cli(huge)), "too large for a config file")
    secret = tmp_path / "secret.toml"
    secret.write_text(TINY_TOML.format(layers=2))
    real_open = os.open

    def denied(path, *args, **kwargs):
        if Path(path) == secret:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)  # works as root too, where chmod 000 does not deny
    one_line_error(*_ce(run_cli(secret)), "permission denied")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_for_real(run_cli, tmp_path):
    secret = tmp_path / "secret.toml"
    secret.write_text(TINY_TOML.format(layers=2))
    secret.chmod(0)
    one_line_error(*_ce(run_cli(secret)), "permission denied")


def _ce(r):
    return r.code, r.err


@pytest.fixture
def modules_built(monkeypatch):
    """The names of the ``torch.nn.Module`` objects constructed in this process while the test runs."""
    torch = pytest.importorskip("torch")
    built, init = [], torch.nn.Module.__init__

    def counting(self, *args, **kwargs):
        built.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__init__", counting)
    return built


# ------------------------------------------------------------------ 5. live runs that cannot exist or would blow up
@pytest.mark.parametrize(
    "args",
    [
        ["crosscheck", "{f}"],
        ["crosscheck", "{f}", "--backward"],
        ["memory", "{f}", "--measure", "meta"],
        ["memory", "{f}", "--dp", "4", "--zero", "3", "--measure", "meta"],
        ["memory", "{f}", "--tp", "2", "--measure", "meta"],
        ["sweep", "{f}", "--contexts", "32", "--crosscheck", "--no-plots", "--out", "{o}"],
    ],
)
def test_deep_models_are_refused_before_building(run_cli, modules_built, tmp_path, args):
    f = tmp_path / "deep.toml"
    f.write_text(TINY_TOML.format(layers=5_000))  # under the 10,000-layer model bound, over the live ones
    r = run_cli(*[a.format(f=f, o=tmp_path / "out") for a in args])
    one_line_error(r.code, r.err, "5,000 live layers")
    assert modules_built == []  # refused before any nn.Module exists (a meta build: ~5 GB, 1 MB a layer)
    assert not (tmp_path / "out").exists()
    import torch

    torch.nn.Linear(1, 1)  # the counter counts
    assert modules_built == ["Linear"]


def test_tensors_beyond_torch_storage_limit_are_refused():
    """Exactly at torch's limit: B·h·S²·4 bytes of attention scores, 2^62 passes and 2^63 is refused,
    as torch itself does on meta."""
    torch = pytest.importorskip("torch")
    S = 2**30
    cfg = ModelConfig(vocab_size=2, context_length=S, num_layers=1, d_model=2, num_heads=1, d_ff=1)
    check_live_run(cfg, S, 1, "meta", "x")  # 1·1·2^60 elements × 4 bytes = 2^62
    torch.empty(1, 1, S, S, device="meta")
    with pytest.raises(AccountingError, match="attention scores .* 2\\^63-byte limit"):
        check_live_run(cfg, S, 2, "meta", "x")
    with pytest.raises(RuntimeError, match="overflow"):
        torch.empty(2, 1, S, S, device="meta")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        (["crosscheck", "gpt2-xl", "--context", 10**10], "2^63-byte limit"),
        (["memory", "gpt2-xl", "--context", 10**10, "--measure", "meta"], "2^63-byte limit"),
        (["crosscheck", "gpt2-small", "--batch", 10**18], "2^63-byte limit"),
        (["memory", "gpt2-xl", "--context", 2**20, "--measure", "cpu"], "80% of the"),
        (["crosscheck", "gpt2-xl", "--context", 2**20, "--device", "cpu"], "80% of the"),
        # one rank of a layout: the same guards (before: a traceback, or 21.9 GB allocated first)
        (["memory", "gpt2-small", "--dp", 2, "--zero", 3, "--measure", "meta", "--context", 10**12], "2^63-byte"),
        (
            [
                "memory",
                "gpt2-small",
                "--dp",
                2,
                "--zero",
                3,
                "--measure",
                "cpu",
                "--measure-method",
                "allocator",
                "--context",
                100_000,
            ],
            "80% of the",
        ),
    ],
)
def test_impossible_live_runs_fail_fast(args, needle):
    code, err, rss = cli(*args)
    one_line_error(code, err, needle)
    assert rss < 1.5e9


def test_cuda_without_a_gpu(run_cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    one_line_error(*_ce(run_cli("memory", "gpt2-small", "--measure", "cuda")), "no CUDA GPU")
    with pytest.raises(AccountingError, match="no CUDA GPU"):
        check_live_run(load_config("gpt2-small"), 1024, 1, "cuda", "x")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        (["memory", "gpt2-small", "--layers", 10**9], "num_layers = 1,000,000,000 is beyond the supported 10,000"),
        (["memory", "gpt2-small", "--layers", 10**9, "--tp", 2], "beyond the supported 10,000"),
        (["infer", "gpt2-small", "--prompt", 100, "--generate", 10, "--layers", 10**9], "supported 10,000"),
        (["memory", "llama-3-8b", "--dp", 10**8, "--zero", 1], "beyond the supported 1,048,576"),
        (["memory", "llama-3-8b", "--dp", 10**12, "--zero", 1], "beyond the supported 1,048,576"),
        (["memory", "mixtral-8x7b", "--dp", 8, "--ep", 2**21, "--zero", 3], "ep = 2,097,152 is beyond"),
    ],
)
def test_walked_sizes_are_bounded(args, needle):
    """The step replay, the KV cache and FSDP2's units walk the layers, and ZeRO-1's owners the ranks:
    before, a billion layers hung at 14.5 GB (MemoryError with --tp and in infer), and dp 10^8 took
    42 s and 11 GB (dp 10^12: MemoryError)."""
    code, err, rss = cli(*args)
    one_line_error(code, err, needle)
    assert rss < 5e8


@pytest.mark.slow
def test_the_bounds_themselves_answer_fast():
    """At the bounds, an answer: 10,000 layers with TP, and 2^20 GPUs of ZeRO-1 (measured 0.5 s each)."""
    for args in (
        ["memory", "gpt2-small", "--layers", 10_000, "--tp", 2],
        ["memory", "llama-3-8b", "--dp", 2**20, "--zero", 1],
    ):
        code, err, rss = cli(*args)
        assert code == 0, err
        assert rss < 5e8


def test_host_memory_bound_and_cpu_fraction(monkeypatch):
    per = devices.COUNTING_HOST_BYTES_PER_LAYER
    ok = devices.MAX_HOST_BYTES // per
    check_live_run(ModelConfig(**{**TINY, "num_layers": ok}), 32, 1, "meta", "x")
    with pytest.raises(AccountingError, match=f"{ok + 1:,} live layers"):
        check_live_run(ModelConfig(**{**TINY, "num_layers": ok + 1}), 32, 1, "meta", "x")
    # CPU: refused above 80 % of MemAvailable, whatever this machine has
    cfg = load_config("gpt2-small")
    from lm_accounting.analytic.replay import predict_training_step

    need = predict_training_step(cfg, 1024, 1, "fp32", "foreach", mode="traced").peak
    monkeypatch.setattr(devices, "available_bytes", lambda device: need * 5 // 4)  # need = 80 % exactly
    check_live_run(cfg, 1024, 1, "cpu", "x", training=True)
    monkeypatch.setattr(devices, "available_bytes", lambda device: need * 5 // 4 - 2)
    with pytest.raises(AccountingError, match="80% of"):
        check_live_run(cfg, 1024, 1, "cpu", "x", training=True)


def test_measure_step_refuses_before_torch_builds(monkeypatch):
    pytest.importorskip("torch")
    from lm_accounting import model

    monkeypatch.setattr(model, "build_model", lambda *a, **k: pytest.fail("built a model"))
    from lm_accounting.measure.memory import measure_step

    with pytest.raises(AccountingError, match="live layers"):
        measure_step(ModelConfig(**{**TINY, "num_layers": 5_000}), 32, 1, "fp32", "meta", "foreach")
    with pytest.raises(AccountingError, match="exceeds the model's context_length"):
        measure_step(ModelConfig(**TINY), 64)
    with pytest.raises(AccountingError, match="fused AdamW has no meta kernels"):
        measure_step(ModelConfig(**TINY), 32, optimizer="fused")


@pytest.mark.slow
@pytest.mark.parametrize("training, layers", [(False, 40), (True, 40)])
def test_per_layer_host_memory_constant_holds(training, layers):
    """The per-layer bound of check_live_run against a real run's peak RSS growth (fresh processes)."""
    code = (
        "import resource,sys;from lm_accounting import ModelConfig;"
        "c=ModelConfig(vocab_size=97,context_length=32,num_layers=int(sys.argv[1]),d_model=64,num_heads=4,d_ff=256);"
        + (
            "from lm_accounting.measure.memory import measure_step as f;"
            if training
            else "from lm_accounting.measure.crosscheck import crosscheck as f;"
        )
        + "import torch;b=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        + ("f(c,32,1,'fp32','meta','foreach')" if training else "f(c,32,1,backward=True)")
        + ";print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss-b)*1024)"
    )
    grow = [
        int(
            subprocess.run(
                [sys.executable, "-c", code, str(n)], capture_output=True, text=True, timeout=300, check=True
            ).stdout
        )
        for n in (2, layers)
    ]
    per_layer = (grow[1] - grow[0]) / (layers - 2)
    bound = devices.TRAINING_HOST_BYTES_PER_LAYER if training else devices.COUNTING_HOST_BYTES_PER_LAYER
    assert per_layer < bound, (per_layer, bound)


# ------------------------------------------------------------------ 6. sweeps that would run for hours
def test_long_live_sweeps_need_allow_long(run_cli, tmp_path):
    r = run_cli(
        "sweep",
        "gpt2-xl",
        "--contexts",
        "1:1000:+1",
        "--crosscheck",
        "--measure-memory",
        "meta",
        "--no-plots",
        "--out",
        tmp_path / "s",
    )
    one_line_error(r.code, r.err, "--allow-long")
    assert not (tmp_path / "s").exists()
    xl = load_config("gpt2-xl")
    points = [(xl, seq) for seq in range(1, 1001)]
    with pytest.raises(AccountingError, match=r"would take about \d+(\.\d)? h"):
        check_live_points(points, 1, "fp32", "foreach", True, "meta", allow_long=False)
    seconds = check_live_points(points, 1, "fp32", "foreach", True, "meta", allow_long=True)
    assert seconds > 3600  # 1,000 GPT-2 XL points of ~19 s each


def test_analytic_sweeps_are_capped(run_cli):
    assert len(parse_contexts(f"1:{MAX_POINTS}:+1")) == MAX_POINTS
    r = run_cli("sweep", "gpt2-small", "--contexts", f"1:{MAX_POINTS + 1}:+1", "--no-plots")
    one_line_error(r.code, r.err, f"more than {MAX_POINTS:,} contexts")
    r = run_cli("sweep", "gpt2-small", "--contexts", ",".join(["5"] * (MAX_POINTS + 1)), "--no-plots")
    one_line_error(r.code, r.err, f"more than {MAX_POINTS:,} contexts")


@pytest.mark.slow
def test_largest_analytic_sweep_is_bounded(tmp_path):
    """The worst analytic sweep (MAX_POINTS contexts, all plots) finishes in bounded memory (its speed is
    measured in benchmarks/, not asserted)."""
    code, err, rss = cli(
        "sweep", "gpt2-small", "--contexts", f"1:{MAX_POINTS}:+1", "--out", tmp_path / "s", timeout=600
    )
    assert code == 0, err
    assert rss < 1.5e9


# ------------------------------------------------------------------ 7. write errors
def test_write_errors_name_the_path(tmp_path):
    def full(tmp):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "d" / "f.csv"
    with pytest.raises(AccountingError, match=f"cannot write {target}: No space left on device"):
        write_with(target, full)
    assert list((tmp_path / "d").iterdir()) == []  # the temporary file is gone


def test_cli_write_errors(run_cli, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    r = run_cli("sweep", "gpt2-small", "--contexts", "128", "--no-plots", "--out", tmp_path / "file" / "out")
    one_line_error(r.code, r.err, "is not a directory")

    def full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full)  # the disk fills up
    r = run_cli("sweep", "gpt2-small", "--contexts", "128", "--no-plots", "--out", tmp_path / "out")
    one_line_error(r.code, r.err, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no output, no temp folder, no lock
    monkeypatch.undo()

    real_mkdir = os.mkdir

    def denied(path, *args, **kwargs):
        if ".out.tmp-" in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", denied)
    r = run_cli("sweep", "gpt2-small", "--contexts", "128", "--no-plots", "--out", tmp_path / "out")
    one_line_error(r.code, r.err, "Permission denied")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_permission_denied_for_real(run_cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    r = run_cli("sweep", "gpt2-small", "--contexts", "128", "--no-plots", "--out", locked / "out")
    one_line_error(r.code, r.err, "Permission denied")


# ------------------------------------------------------------------ 8. a name never becomes a path
def test_safe_filename():
    assert safe_filename("gpt2-xl") == "gpt2-xl" and safe_filename("qwen3-0.6b") == "qwen3-0.6b"
    hostile = [
        "../../etc/passwd",
        "a/b",
        "a\\b",
        "a\x00b",
        "..",
        ".",
        "",
        ".hidden",
        "a..b",
        "x" * 500,
        "gpt2-xl (modified: d_ff=4288)",
        "名前",
    ]
    names = [safe_filename(n) for n in hostile]
    for name in names:
        assert name and "/" not in name and "\\" not in name and "\x00" not in name and ".." not in name
        assert not name.startswith(".") and len(name) <= 80
        assert all(c.isascii() and (c.isalnum() or c in "._+-") for c in name)
    assert len(set(names)) == len(names)
    assert safe_filename("a/b") != safe_filename("a_b")  # sanitising never merges two names


@pytest.mark.slow
def test_a_hostile_model_name_stays_inside_out(tmp_path):
    from lm_accounting import sweep
    from lm_accounting.views.sweep import write_sweep

    cfg = ModelConfig(**TINY, name="../../escaped")
    out = tmp_path / "a" / "out"
    write_sweep(sweep([cfg], [16, 32]), out, 80 * 10**9, "80 GB")
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["a", "out", *(p.name for p in out.iterdir())])
    assert any(p.name.startswith("memory_vs_context_") and "escaped" in p.name for p in out.iterdir())


# ------------------------------------------------------------------ 9. units
@pytest.mark.parametrize(
    "budget, needle",
    [
        ("80Gb", "bits"),
        ("80gb", "bits"),
        ("80", "needs a number and a unit"),
        ("80 parsecs", "needs a number and a unit"),
        (f"{BIG}GB", "characters"),
    ],
)
def test_budget_units_on_the_command_line(run_cli, budget, needle):
    one_line_error(*_ce(run_cli("memory", "gpt2-small", "--budget", budget)), needle)


@pytest.mark.parametrize(
    "args, needle",
    [
        # prices and utilisations: finite and sane (before: tracebacks on inf, nan and 1e308 with JSON)
        (["plan", "llama-3-8b", "--tokens", "1e12", "--price-per-gpu-hour", "inf"], "finite number in [0, 1,000,000]"),
        (["plan", "llama-3-8b", "--tokens", "1e12", "--price-per-gpu-hour", "nan"], "got 'nan'"),
        (["plan", "llama-3-8b", "--tokens", "1e12", "--price-per-gpu-hour", "-2"], "got '-2'"),
        (["plan", "llama-3-8b", "--tokens", "1e12", "--price-per-gpu-hour", "1e308", "--format", "json"], "1e308"),
        (["train-time", "gpt2-xl", "--efficiency", "5e-324", "--format", "json"], "in (0, 1.5]"),
        (["train-time", "gpt2-xl", "--peak-flops", "inf"], "in [1, 1e+20] FLOP/s"),
        # counts: ASCII digits; the right reason for a huge exponent
        (["memory", "gpt2-small", "--batch", "١٠٢٤"], "must be a positive integer"),
        (["memory", "gpt2-small", "--context", "1e100"], "'1e100' is beyond the supported 10^18"),
        # sizes: the right reason
        (["memory", "gpt2-small", "--budget", "1e30GB"], "plain digits"),
        (["memory", "gpt2-small", "--budget", "infGB"], "plain digits"),
        (["memory", "gpt2-small", "--budget", "1000000000TB"], "beyond the supported 10^18 bytes"),
        (["plan", "llama-3-8b", "--tokens", "1e12", "--allowance", "100GB"], "leaves nothing of the h100-80gb"),
        # output paths, checked before any work
        (["sweep", "gpt2-small", "--out", ""], "the output folder is empty"),
        (["plan", "llama-3-8b", "--tokens", "1e12", "--plot", ""], "give a file name stem"),
    ],
)
def test_numbers_and_paths_get_the_right_reason(run_cli, args, needle):
    one_line_error(*_ce(run_cli(*args)), needle)


def test_a_plot_under_a_file_is_refused_before_the_plan(tmp_path):
    (tmp_path / "afile").write_text("mine")
    code, err, _ = cli("plan", "llama-3-8b", "--tokens", "1e12", "--plot", tmp_path / "afile" / "sub")
    one_line_error(code, err, "exists and is not a directory")
    assert (tmp_path / "afile").read_text() == "mine"
