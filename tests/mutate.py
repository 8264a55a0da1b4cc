"""Mutation testing of one module against its own tests (see tests/MUTATION.md).

    python tests/mutate.py simulations/compare.py                 # every mutant
    python tests/mutate.py simulations/compare.py --max-mutants 40 --seed 1
    python tests/mutate.py shapedtx/metrics.py --lines 60-85 --tests tests/test_metrics.py
    python tests/mutate.py shapedtx/design.py --survivors design.log   # after adding tests

The module is parsed with ``ast``; one mutation at a time (arithmetic operator swap, comparison
flip, ``and``/``or`` swap, ``not``/unary minus dropped, numeric constant +1 or x1.1, ``True``/
``False`` swapped, return value negated, slice bound dropped) is written into a *copy* of the
working tree (the tracked and untracked-but-not-ignored files, in a temporary directory; the
real files are never touched), and the module's tests (:data:`TESTS`, or ``--tests``) run with
``pytest -x -q`` under a per-mutant timeout. A mutant is *killed* when a test fails or
errors, *survives* when they all pass, and *timed out* when the tests did not finish in time
(reported apart: a slow machine, or a mutant that loops, is not a failing test; re-run them with
a longer ``--timeout`` and ``--survivors``). Survivors and timeouts are printed with their line
and the mutated line: judge each one (equivalent, or a missing test).

Speed: torch, numpy, scipy, xarray, dask and pytest are imported once; every mutant runs in a
forked child, which imports the project (with the mutant) afresh. Run one module at a time.
Docstrings, f-strings, annotations and ``__all__`` are never mutated.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: module -> the test files (or pytest node ids / -k expressions after "::") that own it.
#: A "::-k EXPR" entry passes -k to the whole run: it deselects the other files' tests too.
TESTS: dict[str, list[str]] = {
    "shapedtx/_validation.py": ["tests/test_validation.py"],
    "shapedtx/metrics.py": [
        "tests/test_metrics.py",
        "tests/test_train.py::test_covariance_metrics_average_the_metrics_over_the_batch",
    ],
    "shapedtx/design.py": ["tests/test_design.py"],
    "shapedtx/bottleneck.py": ["tests/test_bottleneck.py"],
    "shapedtx/diagnostics/probing.py": ["tests/test_probe.py::-k not transformers_gpt2"],
    "shapedtx/diagnostics/hooks.py": [
        "tests/test_hooks_teeth.py",
        "tests/test_probe.py::-k not gpt2",
        "tests/test_coord_check.py::-k not gpt2",
    ],
    "shapedtx/diagnostics/updates.py": [
        "tests/test_hooks_teeth.py",
        "tests/test_monitor.py::-k not gpt2",
        "tests/test_coord_check.py::-k not gpt2",
    ],
    "shapedtx/diagnostics/attention.py": ["tests/test_monitor_teeth.py", "tests/test_monitor.py"],
    "shapedtx/diagnostics/monitor.py": [
        "tests/test_monitor_teeth.py",
        "tests/test_monitor.py",
        "tests/test_monitor_shape.py",
    ],
    "shapedtx/diagnostics/coordinates.py": [
        "tests/test_coord_check_teeth.py",
        "tests/test_coord_check.py::test_bad_arguments_are_refused_before_any_model_is_built",
    ],
    "shapedtx/training/transfer.py": ["tests/test_transfer.py"],
    "simulations/compare.py": ["tests/test_compare.py"],
    "simulations/convergence.py": ["tests/test_compare.py"],
    "simulations/grid.py": ["tests/test_sweep.py"],
    "simulations/sweep/store.py": ["tests/test_sweep.py"],
    "simulations/sweep/point.py": ["tests/test_sweep.py"],
    "simulations/sweep/run.py": ["tests/test_sweep.py"],
    "simulations/sweep/read.py": ["tests/test_sweep.py"],
    "simulations/gram.py": ["tests/test_gram.py", "tests/test_gram_wishart.py"],
    "simulations/wishart.py": ["tests/test_gram_wishart.py"],
    "simulations/samplers.py": ["tests/test_simulate.py", "tests/test_simulate_law.py"],
    "simulations/driver.py": ["tests/test_simulate.py"],
    "simulations/rng.py": ["tests/test_simulate.py", "tests/test_simulate_perf.py"],
    "simulations/_compiled_random.py": ["tests/test_simulate_perf.py::-k compiled_fill"],
    "simulations/_compiled_cholesky.py": ["tests/test_compiled_cholesky.py"],
    "shapedtx/_memory.py": ["tests/test_memory.py"],
    "shapedtx/_compiled_centring.py": ["tests/test_attention_fused.py"],
    "simulations/presets.py": ["tests/test_compare_cli.py"],
    "simulations/baselines.py": ["tests/test_compare_cli.py"],
    "shapedtx/training/trainer.py": ["tests/test_train.py", "tests/test_schedule_teeth.py"],
    "shapedtx/training/model.py": ["tests/test_train.py"],
    "shapedtx/training/config.py": ["tests/test_train.py", "tests/test_schedule_teeth.py"],
    "shapedtx/training/data.py": ["tests/test_train_data.py", "tests/test_data_teeth.py"],
    "shapedtx/training/horizons.py": ["tests/test_schedule_teeth.py"],
    "simulations/training_runs.py": ["tests/test_training_runs_teeth.py"],
    "simulations/studies.py": [
        "tests/test_studies_teeth.py",
        "tests/test_studies.py::test_lr_tag_is_the_one_encoding_of_run_keys",
        "tests/test_studies.py::test_store_appends_once_per_key_in_key_order_and_reads_back",
        "tests/test_studies.py::test_store_rejects_a_line_that_is_not_a_run",
        "tests/test_studies.py::test_ingest_takes_every_result_json_not_stored_and_leaves_the_files",
    ],
    "simulations/stability.py": [
        "tests/test_stability_teeth.py",
        "tests/test_stability.py::test_exit_times_by_hand",
        "tests/test_stability.py::test_bad_input_names_the_parameter",
    ],
    "shapedtx/training/log.py": ["tests/test_train.py"],
    "sde/coefficients.py": ["tests/test_sde_coefficients.py", "tests/test_sde_causal.py"],
    "sde/noise.py": [
        "tests/test_sde_solvers.py",
        "tests/test_sde_causal.py",
        "tests/test_sde_coefficients.py",
    ],
    "sde/solvers.py": [
        "tests/test_sde_solvers.py",
        "tests/test_sde_steppers.py",
        "tests/test_sde_causal.py",
    ],
    "sde/solve.py": ["tests/test_sde_solvers.py"],
    "sde/torchsde_solver.py": ["tests/test_sde_solvers.py", "tests/test_sde_causal.py"],
    "simulations/experiment.py": ["tests/test_compare_cli.py", "tests/test_compare.py"],
    "simulations/advise.py": ["tests/test_advise.py"],
    "simulations/plots.py": ["tests/test_compare.py"],
    "simulations/options.py": ["tests/test_options.py", "tests/test_simulate.py"],
    "shapedtx/options.py": ["tests/test_options.py", "tests/test_simulate.py"],
    "shapedtx/training/plots.py": ["tests/test_train.py"],
    "sde/time_grid.py": ["tests/test_sde_solvers.py"],
    "sde/options.py": ["tests/test_options.py", "tests/test_sde_solvers.py"],
    "simulations/formatting.py": ["tests/test_formatting.py"],
}

_BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
}
_CMP_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclass(frozen=True)
class Mutant:
    index: int  # position of the node in ast.walk order
    kind: str
    line: int
    description: str


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: docstrings, f-strings, annotations, ``__all__``."""
    skip: set[int] = set()

    def add(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            add(first)
        if isinstance(node, ast.JoinedStr):
            add(node)
        if isinstance(node, (ast.AnnAssign, ast.arg)):
            add(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node.returns)
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            add(node)
    return skip


def _sites(node: ast.AST) -> list[tuple[str, str]]:
    """(kind, description) of the mutations applicable to ``node``."""
    out = []
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAP:
        new = _BINOP_SWAP[type(node.op)]
        out.append(("binop", f"{type(node.op).__name__} -> {new.__name__}"))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in _CMP_SWAP:
                out.append((f"cmp{i}", f"{type(op).__name__} -> {_CMP_SWAP[type(op)].__name__}"))
    elif isinstance(node, ast.BoolOp):
        out.append(("boolop", "and <-> or"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
        out.append(("unary", f"drop {type(node.op).__name__}"))
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            out.append(("const", f"{v} -> {not v}"))
        elif isinstance(v, int):
            out.append(("const", f"{v} -> {v + 1}"))
        elif isinstance(v, float):
            out.append(("const", f"{v!r} -> {v * 1.1 if v else 1.0!r}"))
    elif isinstance(node, ast.Return) and node.value is not None:
        v = node.value
        if not isinstance(v, (ast.Tuple, ast.Dict, ast.List, ast.Constant, ast.JoinedStr)):
            out.append(("return", "return -value"))
    elif isinstance(node, ast.Slice):
        if node.lower is not None:
            out.append(("slice_lower", "drop slice lower bound"))
        if node.upper is not None:
            out.append(("slice_upper", "drop slice upper bound"))
    return out


def enumerate_mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skipped_nodes(tree)
    mutants = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        for kind, description in _sites(node):
            mutants.append(Mutant(index, kind, getattr(node, "lineno", 0), description))
    return mutants


def apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.index]
    kind = mutant.kind
    if kind == "binop":
        node.op = _BINOP_SWAP[type(node.op)]()
    elif kind.startswith("cmp"):
        i = int(kind[3:])
        node.ops[i] = _CMP_SWAP[type(node.ops[i])]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "unary":
        return _replace(tree, node, node.operand)
    elif kind == "const":
        v = node.value
        node.value = (not v) if isinstance(v, bool) else v + 1 if isinstance(v, int) else (
            v * 1.1 if v else 1.0
        )  # fmt: skip
    elif kind == "return":
        node.value = ast.UnaryOp(op=ast.USub(), operand=node.value)
    elif kind == "slice_lower":
        node.lower = None
    elif kind == "slice_upper":
        node.upper = None
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace(tree: ast.Module, old: ast.AST, new: ast.AST) -> str:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
    return ast.unparse(ast.fix_missing_locations(tree))


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    for data in ("tests/data",):  # ignored test inputs, if any
        if (ROOT / data).is_dir() and not (dest / data).exists():
            shutil.copytree(ROOT / data, dest / data)


def _preload() -> None:
    """Import the heavy third-party libraries once (children inherit them on fork)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    for name in (
        "numpy", "scipy.stats", "scipy.special", "torch", "xarray", "pandas", "matplotlib.pyplot",
        "torchsde", "zarr", "dask.array", "distributed", "pytest", "hypothesis", "tqdm.auto",
    ):  # fmt: skip
        with contextlib.suppress(ImportError):
            __import__(name)


def _run_tests(workdir: Path, args: list[str], timeout: float) -> tuple[str, float]:
    """Fork, run pytest in ``workdir`` in the child; ('passed'|'failed'|'timeout', seconds)."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setpgid(0, 0)
            os.chdir(workdir)
            sys.path[:] = [str(workdir), *(p for p in sys.path if p != str(ROOT / "tests"))]
            # subprocesses of the tests (CLI runs, Dask workers) import the copy too
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [str(workdir), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
            if not os.environ.get("MUTATE_VERBOSE"):  # MUTATE_VERBOSE=1: show pytest output
                log = os.open(workdir / "pytest.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(log, 1)
                os.dup2(log, 2)
            import pytest

            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *args])
        except BaseException:
            code = 3
        os._exit(int(code))
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return ("passed" if code == 0 else "failed"), time.monotonic() - start
        if time.monotonic() - start > timeout:
            with _ignore():
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - start
        time.sleep(0.05)


class _ignore:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return isinstance(exc[1], ProcessLookupError)


def _parse_lines(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def _test_args(tests: list[str]) -> list[str]:
    args = []
    for t in tests:
        path, sep, expr = t.partition("::-k ")
        args += [path, "-k", expr] if sep else [t]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", help="path of the module, relative to the repository root")
    parser.add_argument("--tests", nargs="+", help="test files (default: the TESTS mapping)")
    parser.add_argument("--max-mutants", type=int, help="random sample of this many mutants")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--lines", help="only mutants on lines A-B (or one line A)")
    parser.add_argument("--timeout", type=float, help="per mutant (default 3 x baseline + 10 s)")
    parser.add_argument(
        "--survivors",
        help="re-run only the mutants printed as SURVIVED or TIMEOUT in this earlier log",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("-m", "--marker", default="not slow", help="pytest -m expression")
    args = parser.parse_args(argv)

    module = args.module
    tests = args.tests or TESTS.get(module)
    if not tests:
        parser.error(f"no tests mapped for {module}; pass --tests")
    source = (ROOT / module).read_text()
    mutants = enumerate_mutants(source)
    total = len(mutants)
    lines = _parse_lines(args.lines)
    if lines:
        mutants = [m for m in mutants if lines[0] <= m.line <= lines[1]]
    if args.survivors:
        wanted = set()
        for row in Path(args.survivors).read_text().splitlines():
            label, _, tail = row.strip().partition(" ")
            if label in ("SURVIVED", "TIMEOUT"):
                where, _, rest = tail.partition(": ")
                wanted.add((int(where.rsplit(":", 1)[1]), rest.split("   | ")[0]))
        mutants = [m for m in mutants if (m.line, m.description) in wanted]
    if args.max_mutants is not None and len(mutants) > args.max_mutants:
        mutants = sorted(
            random.Random(args.seed).sample(mutants, args.max_mutants), key=lambda m: m.index
        )
    if args.list:
        for m in mutants:
            print(f"{module}:{m.line}: {m.description}")
        return 0

    sys.dont_write_bytecode = True  # a mutant must never be shadowed by a cached .pyc
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HYPOTHESIS_PROFILE", "mutate")  # 10 examples per property
    _preload()
    pytest_args = [*_test_args(tests), "-m", args.marker]
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        target = work / module
        status, base = _run_tests(work, pytest_args, timeout=1800)
        if status != "passed":
            print(f"the tests fail on the unmutated tree ({status}); fix them first")
            log = work / "pytest.log"
            print(log.read_text()[-3000:] if log.exists() else "")
            return 2
        timeout = args.timeout or 3 * base + 10
        print(f"{module}: {total} mutants, running {len(mutants)}; tests {' '.join(tests)} "
              f"(baseline {base:.1f} s, timeout {timeout:.0f} s)", flush=True)  # fmt: skip
        survived, timed_out, killed, t0 = [], [], 0, time.monotonic()
        src_lines = source.splitlines()
        for i, m in enumerate(mutants, 1):
            target.write_text(apply(source, m))
            status, _secs = _run_tests(work, pytest_args, timeout)
            target.write_text(source)
            if status == "failed":
                killed += 1
            else:
                (survived if status == "passed" else timed_out).append(m)
                label = "SURVIVED" if status == "passed" else "TIMEOUT"
                code = src_lines[m.line - 1].strip() if m.line else ""
                print(f"  {label} {module}:{m.line}: {m.description}   | {code}", flush=True)
            if i % 10 == 0:
                print(f"  ... {i}/{len(mutants)} ({time.monotonic() - t0:.0f} s)", flush=True)
    n = len(mutants)
    rate = 100.0 * killed / n if n else float("nan")
    print(f"{module}: killed {killed}/{n} ({rate:.1f}%) by failing tests, timed out "
          f"{len(timed_out)}, survived {len(survived)}, {time.monotonic() - t0:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
