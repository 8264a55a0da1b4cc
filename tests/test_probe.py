"""``shapedtx.probe`` / ``CovarianceProbe`` / ``shapedtx probe``: forward hooks on any model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import ks_2samp
from torch import nn

import shapedtx
from shapedtx import metrics
from shapedtx.diagnostics import CovarianceProbe, find_blocks, probe
from shapedtx.metrics import covariance_metrics
from shapedtx.results import load_dataset
from shapedtx.training import LanguageModel
from simulations.cli import main


def _transformer(dtype=torch.float64, width=16, depth=3, seed=0):
    torch.manual_seed(seed)
    config = shapedtx.preset("pre_ln", width=width, depth=depth, causal=True)
    return shapedtx.Transformer(config).to(dtype)


def _tokens(width=16, batch=3, m=5, seed=1):
    V0 = shapedtx.equicorrelated(m, 0.2)
    return shapedtx.initial_tokens(V0, width, batch, torch.Generator().manual_seed(seed))


def _no_hooks(model):
    return all(not (mod._forward_hooks or mod._forward_pre_hooks) for mod in model.modules())


class _TupleBlock(nn.Module):
    """A block returning ``(hidden, extra)`` as ``transformers`` blocks do."""

    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + self.linear(x), None


class _Toy(nn.Module):
    def __init__(self, block, width=8, depth=2):
        super().__init__()
        self.stack = nn.ModuleList([block(width) for _ in range(depth)])

    def forward(self, x):
        for b in self.stack:
            out = b(x)
            x = out[0] if isinstance(out, tuple) else out
        return x


def test_probe_reports_nonfinite_covariances():
    model, X = _transformer(), _tokens()
    assert probe(model, X).attrs["nonfinite"] == 0
    X[1] = torch.nan
    with pytest.warns(RuntimeWarning, match="1 of 3 sequences have non-finite covariances"):
        ds = probe(model, X)
    assert ds.attrs["nonfinite"] == 1
    with pytest.raises(ValueError, match="eval must be True or False"):
        probe(model, X, eval="no")


def test_probe_of_transformer_equals_its_covariances():
    model, X = _transformer(), _tokens()
    ds = probe(model, X)
    assert torch.equal(torch.from_numpy(ds["V"].values), model.covariances(X))
    assert ds["V"].dims == ("sample", "t", "token_a", "token_b")
    np.testing.assert_array_equal(ds["layer"].values, np.arange(4))
    np.testing.assert_allclose(ds["t"].values, np.arange(4) / 16)
    assert shapedtx.config_of(ds) == model.config
    assert ds.attrs["method"] == "probe" and ds.attrs["blocks"] == "blocks.0, blocks.1, blocks.2"
    assert _no_hooks(model) and model.training  # training flag restored
    shapedtx.detect_collapse(torch.from_numpy(ds["V"].values))  # the contract's consumers


def test_float32_stream_gives_float64_covariance():
    ds = probe(_transformer(torch.float32), _tokens().float())
    assert ds["V"].dtype == np.float64 and ds.attrs["stream_dtype"] == "float32"
    assert ds.attrs["config_known"] == 1


def test_hooks_removed_after_an_exception():
    model = _transformer()
    model.blocks[1].register_forward_hook(lambda *a: (_ for _ in ()).throw(KeyError("boom")))
    with pytest.raises(KeyError, match="boom"):
        probe(model, _tokens())
    model.blocks[1]._forward_hooks.clear()
    assert _no_hooks(model) and model.training


def test_tuple_outputs_names_and_generic_attrs():
    model = _Toy(_TupleBlock)
    X = torch.randn(2, 4, 8)
    ds = probe(model, X, blocks=["stack.0", "stack.1"])
    assert ds.sizes == {"sample": 2, "t": 3, "token_a": 4, "token_b": 4}
    hidden = [X, model.stack[0](X)[0]]
    hidden.append(model.stack[1](hidden[1])[0])
    expected = torch.stack([metrics.covariance(h.double()) for h in hidden], 1)
    torch.testing.assert_close(torch.from_numpy(ds["V"].values), expected)
    assert ds.attrs["config_known"] == 0 and ds.attrs["config.width"] == 8
    assert "config.attention" not in ds.attrs
    assert probe(model, X, blocks="stack").equals(ds)
    assert _no_hooks(model)


class _NoneBlock(nn.Module):
    def __init__(self, width):
        super().__init__()

    def forward(self, x):
        return None


@pytest.mark.parametrize(
    ("make", "inputs", "blocks", "needle"),
    [
        (lambda: nn.Sequential(nn.Linear(8, 8)), torch.randn(2, 3, 8), None, "blocks="),
        (_transformer, torch.randn(5, 16), None, "(batch, tokens, width)"),
        (_transformer, torch.randn(2, 5, 7), None, "model(inputs) failed"),
        (lambda: _Toy(_NoneBlock), torch.randn(2, 3, 8), "stack", "not a tensor"),
        (_transformer, torch.randn(2, 5, 16), ["nope"], "no submodule named 'nope'"),
    ],
)
def test_bad_inputs_give_value_error_naming_the_problem(make, inputs, blocks, needle):
    model = make()
    with pytest.raises(ValueError, match=None) as err:
        probe(model, inputs.double() if model is not None else inputs, blocks)
    assert needle in str(err.value), str(err.value)
    assert _no_hooks(model)


class _SharedBlock(nn.Module):
    """One residual block applied twice (weight sharing): its hooks fire twice per call."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(8, 8)

    def forward(self, x):
        return self.block(self.block(x))


@pytest.mark.filterwarnings("ignore:Monitor. attention_entropy")  # no attention here
@pytest.mark.parametrize("who", ["probe", "monitor"])
def test_a_block_run_twice_is_refused_and_the_model_restored(who):
    model = _SharedBlock().double()
    model.train()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError) as err:
        if who == "probe":
            probe(model, x, blocks=[model.block])
        else:
            shapedtx.Monitor(model, x, blocks=[model.block])(0)
    assert err.value.parameter == "blocks"
    assert str(err.value) == (
        f"block 'block' ran 2 times during model(inputs); the {who} needs every block to run "
        "exactly once"
    )
    assert _no_hooks(model) and model.training and model.block.training


class _EncoderModel(nn.Module):
    """A user's model around PyTorch's own encoder (issue 39)."""

    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        layer = nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(self.embed(x))


def test_blocks_of_a_torch_transformer_encoder_are_found_by_themselves():
    torch.manual_seed(0)
    model = _EncoderModel()
    names = [name for name, _ in find_blocks(model)]
    assert names == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2"]
    ds = probe(model, torch.randn(5, 4, 16))
    assert ds["V"].shape == (5, 4, 4, 4)  # input + 3 blocks
    wrapped = nn.Sequential(model)
    assert len(find_blocks(wrapped)) == 3
    both = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    with pytest.raises(ValueError, match=r"several torch Transformer stacks.*encoder\.layers"):
        find_blocks(both)


def test_language_model_blocks_found_and_match_the_trainer_metrics():
    config = shapedtx.preset("pre_ln", width=16, depth=2, causal=True)
    torch.manual_seed(0)
    model = LanguageModel(config, max_len=8)
    assert [name for name, _ in find_blocks(model)] == ["body.blocks.0", "body.blocks.1"]
    tokens = torch.randint(0, 256, (3, 8))
    ds = probe(model, tokens)
    expected = covariance_metrics(model.hidden_states(tokens))["mean_rho"]
    rho = metrics.mean_correlation(torch.from_numpy(ds["V"].values)).mean(0).numpy()
    np.testing.assert_allclose(rho, expected, rtol=1e-12)


def test_covariance_probe_in_a_training_loop():
    model, X = _transformer(torch.float32, depth=2), _tokens().float()
    cov = CovarianceProbe(model, X, every=2, max_pending=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        assert cov(step) == (step % 2 == 0)
        model(X).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    cov(6)
    log = cov.dataset()
    np.testing.assert_array_equal(log["step"].values, [0, 2, 4, 6])
    assert log["mean_rho"].dims == ("step", "layer") and log.sizes["layer"] == 3
    assert _no_hooks(model) and model.training
    model.eval()
    expected = covariance_metrics(model(X, return_hidden=True)[1])
    for name in ("mean_rho", "stable_rank"):
        np.testing.assert_allclose(log[name].sel(step=6).values, expected[name], rtol=1e-12)
    with pytest.raises(ValueError, match="every"):
        CovarianceProbe(model, X, every=0)


def test_cli_probe_of_a_train_checkpoint(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("hello shaped world, hello collapse. " * 30)
    run = tmp_path / "run"
    train = [
        "train", "--width", "16", "--depth", "2", "--heads", "2", "--steps", "2",
        "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1", "--log-interval", "2",
        "--eval-interval", "2", "--eval-batches", "1", "--metrics-batch", "3", "--no-progress",
        "--threads", "1", "--data", str(text), "--out", str(run),
    ]  # fmt: skip
    assert main(train) == 0
    capsys.readouterr()
    assert main(["probe", str(run), "--out", str(tmp_path / "p.nc")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 2: ") and "windows collapsed" in out
    ds = load_dataset(tmp_path / "p.nc")
    assert ds.sizes["sample"] == 3 and ds.attrs["step"] == 2
    log = load_dataset(run / "log.nc")
    rho = metrics.mean_correlation(torch.from_numpy(ds["V"].values)).mean(0).numpy()
    np.testing.assert_allclose(rho, log["mean_rho"].sel(step=2).values, rtol=1e-5)
    other = tmp_path / "other.txt"
    other.write_text("another text, another corpus. " * 30)
    for argv, needle in (
        (["probe", str(tmp_path / "none")], "not found"),
        (["probe", str(run), "--out", "x.txt"], "--out"),
        (["probe", str(run), "--data", str(other)], "differs from the run's in --data"),
        (["probe", str(run), "--max-bytes", "500"], "in --max-bytes (or --suffix): 500 bytes"),
        (["probe", str(run), "--val-fraction", "0.5"], "in --val-fraction"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err


def test_cli_probe_reuses_the_runs_data_settings(tmp_path, capsys, monkeypatch):
    """Issue 39: `train --max-bytes N` then `probe RUN` failed with "the data (X) differs from
    the run's (X)"; the probe now reads RUN/data.json (or, for older runs, the log's size)."""
    text = tmp_path / "text.txt"
    text.write_text("hello shaped world, hello collapse. " * 60)
    run = tmp_path / "run"
    train = [
        "train", "--width", "16", "--depth", "2", "--heads", "2", "--steps", "1",
        "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "0", "--log-interval", "1",
        "--eval-interval", "1", "--eval-batches", "1", "--metrics-batch", "2", "--no-progress",
        "--threads", "1", "--data", str(text), "--out", str(run), "--max-bytes", "1500",
        "--val-fraction", "0.3",
    ]  # fmt: skip
    assert main(train) == 0
    assert json.loads((run / "data.json").read_text())["max_bytes"] == 1500
    monkeypatch.chdir(tmp_path.parent)  # the recorded path is absolute
    capsys.readouterr()
    assert main(["probe", str(run)]) == 0, capsys.readouterr().err
    (run / "data.json").unlink()  # a run from before data.json: the log's size is used
    assert main(["probe", str(run), "--val-fraction", "0.3"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# A real client: transformers' GPT-2 against the library's pre-LN preset, in law
# --------------------------------------------------------------------------------------------
WIDTH, DEPTH, TOKENS, DRAWS = 32, 6, 8, 200
EMBED_VAR = 0.02**2  # GPT-2's token-embedding variance (position embeddings zeroed)


def _gpt2_covariances(seed, *, scale_c_proj=1.0, draws=DRAWS):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    hf = transformers.GPT2Config(
        n_embd=WIDTH, n_layer=DEPTH, n_head=4, n_positions=TOKENS, vocab_size=8,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        initializer_range=0.02, layer_norm_epsilon=1e-6,  # the library's LayerNorm epsilon
    )  # fmt: skip
    V0 = shapedtx.equicorrelated(TOKENS, 0.2, EMBED_VAR)
    gen = torch.Generator().manual_seed(seed)
    model = transformers.GPT2Model(hf).double()
    out = []
    for draw in range(draws):  # fresh weights per sample (GPT-2's own init): independent
        torch.manual_seed(seed * 100_003 + draw)
        model.apply(model._init_weights)
        with torch.no_grad():
            model.wpe.weight.zero_()
            for block in model.h:
                block.attn.c_proj.weight.mul_(scale_c_proj)
                block.mlp.c_proj.weight.mul_(scale_c_proj)
        X0 = shapedtx.initial_tokens(V0, WIDTH, 1, gen)
        out.append(probe(model, {"inputs_embeds": X0})["V"].values[0])
    return np.stack(out)


def _preset_covariances(seed, draws=DRAWS):
    config = shapedtx.preset("pre_ln", width=WIDTH, depth=DEPTH, causal=True)
    V0 = shapedtx.equicorrelated(TOKENS, 0.2, EMBED_VAR)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for draw in range(draws):
        torch.manual_seed(seed * 100_003 + draw)
        model = shapedtx.Transformer(config).double()
        out.append(probe(model, shapedtx.initial_tokens(V0, WIDTH, 1, gen))["V"].values[0])
    return np.stack(out)


def _summaries(V):
    """Per-sample mean rho and mean log V^{aa}: (draws, layer) each."""
    rho = metrics.mean_correlation(torch.from_numpy(V)).numpy()
    return rho, np.log(np.diagonal(V, axis1=-2, axis2=-1)).mean(-1)


def _min_ks_pvalue(a, b):
    return min(
        ks_2samp(x[:, layer], y[:, layer]).pvalue
        for x, y in zip(_summaries(a), _summaries(b), strict=True)
        for layer in range(1, DEPTH + 1)
    )


def test_transformers_gpt2_agrees_in_law_with_the_pre_ln_preset():
    hf, ours = _gpt2_covariances(1), _preset_covariances(2)
    # 2 statistics x 6 layers at 200 vs 200 independent draws: Bonferroni at 1%
    assert _min_ks_pvalue(hf, ours) > 0.01 / 12
    # collapse layers (first layer with mean rho above the threshold; never: DEPTH + 1)
    first = {}
    for threshold in (0.99, 0.22):  # 0.99: the usual one; 0.22: about half-way at depth 6
        first[threshold] = [
            np.where(c.collapsed, c.first_index, DEPTH + 1)
            for c in (shapedtx.detect_collapse(torch.from_numpy(V), threshold) for V in (hf, ours))
        ]
    assert (first[0.99][0] == DEPTH + 1).all() and (first[0.99][1] == DEPTH + 1).all()
    a, b = first[0.22]
    assert ks_2samp(a, b).pvalue > 0.01 and abs(np.median(a) - np.median(b)) <= 1
    # the test has power: GPT-2 without its 1/sqrt(2 depth) scaling of c_proj is rejected
    unscaled = _gpt2_covariances(3, scale_c_proj=(2 * DEPTH) ** 0.5, draws=60)
    assert _min_ks_pvalue(unscaled, ours[:60]) < 1e-6


class _DropoutBlock(nn.Module):
    """``x + dropout(linear(x))``, recording the training flags it runs with."""

    def __init__(self, width):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.drop = nn.Dropout(0.5)
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x):
        self.seen.append((self.training, self.drop.training))
        return x + self.drop(self.linear(x))


def _dropout_model():
    torch.manual_seed(3)
    model = _Toy(_DropoutBlock, width=8, depth=2).double().train()
    model.stack[1].drop.eval()  # a mixed state, restored as it was
    return model


def _flags(model):
    return [m.training for m in model.modules()]


def _eval_covariances(model, X):
    """The covariances of the model in eval mode (no dropout), written out by hand."""
    flags = _flags(model)
    model.eval()
    with torch.no_grad():
        h1 = model.stack[0](X)
        hidden = [X, h1, model.stack[1](h1)]
    for m, flag in zip(model.modules(), flags, strict=True):
        m.training = flag
    return torch.stack([metrics.covariance(h) for h in hidden], 1)


def test_probe_runs_a_model_with_dropout_in_eval_mode_and_restores_its_flags():
    """probe(eval=True) (the default): no dropout, every module's flag restored afterwards;
    eval=False runs the model in the modes it is in (here training: dropout active)."""
    model, X = _dropout_model(), torch.randn(3, 5, 8, dtype=torch.float64)
    before = _flags(model)
    expected = _eval_covariances(model, X)
    for block in model.stack:
        block.seen.clear()
    ds = probe(model, X, blocks="stack")
    assert [b.seen for b in model.stack] == [[(False, False)], [(False, False)]]
    torch.testing.assert_close(torch.from_numpy(ds["V"].values), expected, rtol=1e-12, atol=0)
    assert _flags(model) == before and model.training
    for block in model.stack:
        block.seen.clear()
    torch.manual_seed(0)
    train = probe(model, X, blocks="stack", eval=False)
    assert [b.seen for b in model.stack] == [[(True, True)], [(True, False)]]
    assert _flags(model) == before
    V = torch.from_numpy(train["V"].values)
    torch.testing.assert_close(V[:, 0], expected[:, 0])  # the input, before any dropout
    assert (V[:, 1] - expected[:, 1]).abs().max() > 1e-3  # block 0 dropped units


def test_covariance_probe_passes_eval_on():
    """CovarianceProbe(eval=True) measures in eval mode, eval=False in the model's own."""
    model, X = _dropout_model(), torch.randn(2, 4, 8, dtype=torch.float64)
    before = _flags(model)
    for flag, seen in ((True, (False, False)), (False, (True, True))):
        model.stack[0].seen.clear()
        cov = CovarianceProbe(model, X, blocks="stack", eval=flag)
        assert cov(0) and model.stack[0].seen == [seen]
        assert _flags(model) == before


def test_covariance_probe_defaults_count_calls_from_zero_in_eval_mode(monkeypatch):
    """Documented defaults: ``cov()`` counts calls from 0 (so the first call measures), eval
    mode, and the metrics are computed every ``max_pending`` measurements."""
    model, X = _dropout_model(), torch.randn(2, 4, 8, dtype=torch.float64)
    cov = CovarianceProbe(model, X, every=2, blocks="stack")
    assert [cov(), cov(), cov()] == [True, False, True]
    assert model.stack[0].seen == [(False, False)] * 2
    ds = cov.dataset()
    np.testing.assert_array_equal(ds["step"].values, [0, 2])
    assert (ds.attrs["width"], ds.attrs["stream_dtype"]) == (8, "float64")
    computed = []
    original = metrics.metric_tensors
    monkeypatch.setattr(metrics, "metric_tensors", lambda V: computed.append(1) or original(V))
    cov = CovarianceProbe(model, X, blocks="stack", max_pending=2)
    cov(0)
    assert computed == []  # pending until max_pending measurements
    cov(1)
    assert computed == [1, 1]
    cov(2)
    assert computed == [1, 1]
    assert cov.dataset().sizes["step"] == 3 and computed == [1, 1, 1]


def test_covariance_probe_flushes_every_64_measurements_by_default(monkeypatch):
    """The default ``max_pending`` is 64: 63 measurements stay pending, the 64th computes all."""
    from shapedtx.diagnostics import probing

    model, X = _dropout_model(), torch.randn(2, 4, 8, dtype=torch.float64)
    cov = CovarianceProbe(model, X, blocks="stack")
    recorded = probing._record(model, X, cov.blocks, True)  # one real forward, reused below
    monkeypatch.setattr(probing, "_record", lambda *args: recorded)
    computed = []
    original = metrics.metric_tensors
    monkeypatch.setattr(metrics, "metric_tensors", lambda V: computed.append(1) or original(V))
    for step in range(63):
        assert cov(step)
    assert computed == [] and cov.max_pending == 64
    cov(63)
    assert len(computed) == 64


class _Blocks(nn.Module):
    """A model whose ``blocks`` (first path searched) holds ``n`` blocks, and a ``layers``."""

    def __init__(self, n, width=8):
        super().__init__()
        self.blocks = nn.ModuleList([_TupleBlock(width) for _ in range(n)])
        self.layers = nn.ModuleList([_TupleBlock(width) for _ in range(2)])

    def forward(self, x):
        for b in [*self.blocks, *self.layers]:
            x = b(x)[0]
        return x


def test_find_blocks_takes_the_first_non_empty_path_even_of_one_block():
    """BLOCK_PATHS: the first non-empty ModuleList found, in order; one block is enough."""
    assert [name for name, _ in find_blocks(_Blocks(1))] == ["blocks.0"]
    assert [name for name, _ in find_blocks(_Blocks(0))] == ["layers.0", "layers.1"]
    ds = probe(_Blocks(1), torch.randn(2, 3, 8))
    assert ds.attrs["seed"] == -1 and ds.attrs["source"] == "network"  # documented attrs
    assert ds.attrs["model"] == "_Blocks" and ds.attrs["blocks"] == "blocks.0"


def test_probe_stores_a_given_config_and_refuses_one_of_another_size():
    """config=: stored (config_known 1) when its width and depth are the probed model's;
    a config of another width or depth is refused, naming both."""
    model, X = _Toy(_TupleBlock), torch.randn(2, 3, 8)
    config = shapedtx.ModelConfig(width=8, depth=2, heads=2)
    ds = probe(model, X, blocks="stack", config=config)
    assert ds.attrs["config_known"] == 1 and shapedtx.config_of(ds) == config
    for wrong in (config.replace(depth=3), shapedtx.ModelConfig(width=16, depth=2, heads=2)):
        with pytest.raises(ValueError, match="config has width"):
            probe(model, X, blocks="stack", config=wrong)


def test_two_tokens_and_a_batch_of_one_are_enough():
    """The stream needs (batch, tokens, width) with at least 2 tokens; one sequence is fine."""
    model = _Toy(_TupleBlock)
    ds = probe(model, torch.randn(1, 2, 8), blocks="stack")
    assert ds.sizes == {"sample": 1, "t": 3, "token_a": 2, "token_b": 2}
    with pytest.raises(ValueError, match="at least 2 tokens"):
        probe(model, torch.randn(3, 1, 8), blocks="stack")


def test_covariance_probe_is_the_monitor_reduced_to_the_covariance_metrics():
    """CovarianceProbe is a Monitor: the same hooks and the same covariance metrics, bit for
    bit, without the monitor's other variables."""
    model, X = _transformer(), _tokens()
    cov, mon = CovarianceProbe(model, X), shapedtx.Monitor(model, X)
    assert isinstance(cov, shapedtx.Monitor) and cov(0) and mon(0) is not None
    ours, theirs = cov.dataset(), mon.dataset()
    assert set(ours.data_vars) == set(metrics.METRICS) < set(theirs.data_vars)
    for name in metrics.METRICS:
        np.testing.assert_array_equal(ours[name].values, theirs[name].values)
