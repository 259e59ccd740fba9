"""MathVerifier's grading process starts from every kind of entry point (issue 9, finding 1).

The grading process used to be started with multiprocessing's ``spawn``, which re-runs the caller's
``__main__`` in the child: a plain script without an ``if __name__ == "__main__":`` guard re-entered the
verifier and died with ``EOFError``. Each entry point below therefore runs in its own interpreter, the way
a user would run it, and must print the reward 1.0 and exit cleanly. The scripts deliberately have no
main guard.

The last tests cover what a caller sees when the process cannot start (one line naming the cause and the
fix), concurrent use from several threads, and a process forked after the verifier was used.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from _helpers import children_of, free_port

from mcadvantage.tasks.math import MathVerifier

# The snippet from the issue; \frac{1}{2} vs 0.5 is not decided in-process, so it needs the grading process.
SNIPPET = textwrap.dedent(
    """\
    from mcadvantage import MathVerifier
    v = MathVerifier()
    print("REWARD", v(prompts=["q"], completions=["so \\\\boxed{\\\\frac{1}{2}}"], answer=["0.5"]))
    """
)

# Pairs that all need math-verify (none is decided by the in-process shortcuts), with their verdicts.
HARD_PAIRS = [
    (r"\frac{1}{2}", "0.5", True),
    (r"\sqrt{8}", r"2\sqrt{2}", True),
    ("(x+1)^2", "x^2+2x+1", True),
    (r"\frac{1}{3}", "0.3", False),
    ("x+y", "y+x+1", False),
]


def _run(cmd: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd} exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    assert "EOFError" not in proc.stderr, proc.stderr[-5000:]
    return proc


def _rewards(stdout: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith("REWARD ")]


# ---------------------------------------------------------------- entry points, each in a fresh interpreter


def test_plain_script_without_main_guard(tmp_path: Path):
    script = tmp_path / "plain.py"
    script.write_text(SNIPPET)
    proc = _run([sys.executable, str(script)], tmp_path)
    assert _rewards(proc.stdout) == ["[1.0]"]


def test_python_dash_c(tmp_path: Path):
    proc = _run([sys.executable, "-c", SNIPPET], tmp_path)
    assert _rewards(proc.stdout) == ["[1.0]"]


def test_notebook_style_exec_of_cells(tmp_path: Path):
    # A runner that executes "cells" with exec() in one shared namespace, like a notebook front end; the
    # runner itself is an unguarded script.
    cells = SNIPPET.splitlines(keepends=True)
    runner = tmp_path / "runner.py"
    runner.write_text(
        f"cells = {[cells[0], ''.join(cells[1:])]!r}\n"
        "namespace = {'__name__': '__main__'}\n"
        "for number, cell in enumerate(cells):\n"
        "    exec(compile(cell, f'<cell {number}>', 'exec'), namespace)\n"
    )
    proc = _run([sys.executable, str(runner)], tmp_path)
    assert _rewards(proc.stdout) == ["[1.0]"]


def test_pytest_module_using_the_verifier_at_import_time(tmp_path: Path):
    # Grading at import time of a test module (collection) as well as inside a test.
    (tmp_path / "test_snippet.py").write_text(
        SNIPPET
        + textwrap.dedent(
            """\

            def test_grades():
                assert v(completions=["\\\\boxed{\\\\sqrt{8}}"], answer=["2\\\\sqrt{2}"]) == [1.0]
            """
        )
    )
    proc = _run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_snippet.py"], tmp_path
    )
    assert "1 passed" in proc.stdout
    assert _rewards(proc.stdout) == ["[1.0]"]


@pytest.mark.slow
def test_accelerate_launch_two_processes(tmp_path: Path):
    pytest.importorskip("accelerate")
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    # Each rank joins a gloo group (so the caller has gloo's threads) and grades with its own grading
    # process. Launched like tests/trainer/test_trainer_distributed.py: on a machine without GPUs `--multi_gpu`
    # starts two CPU processes (`--cpu` would start only one); PartialState(cpu=True) then joins them.
    script = tmp_path / "ranks.py"
    script.write_text(
        "import torch\n"
        "from accelerate import PartialState\n"
        "state = PartialState(cpu=True, backend='gloo')\n"
        + SNIPPET.replace('print("REWARD",', 'print("REWARD", state.process_index,')
        + "state.wait_for_everyone()\n"
        "torch.distributed.destroy_process_group()\n"
    )
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    proc = _run([*launch, "--main_process_port", str(free_port()), str(script)], tmp_path, timeout=300)
    assert sorted(_rewards(proc.stdout)) == ["0 [1.0]", "1 [1.0]"]


def test_several_threads_in_an_unguarded_script(tmp_path: Path):
    # 4 threads x 5 calls on one verifier, every answer through math-verify; cache_size=2 makes the
    # threads evict each other's cached verdicts all the time.
    script = tmp_path / "threads.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            import threading
            from mcadvantage import MathVerifier

            PAIRS = {HARD_PAIRS!r}
            v = MathVerifier(cache_size=2)
            errors, results = [], []

            def work(offset):
                try:
                    for k in range(5):
                        pred, gold, expected = PAIRS[(offset + k) % len(PAIRS)]
                        got = v(completions=["\\\\boxed{{" + pred + "}}"], answer=[gold])
                        results.append(got == [float(expected)])
                except BaseException as exc:
                    errors.append(repr(exc))

            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not errors, errors
            assert len(results) == 20 and all(results), results
            print("REWARD", v(completions=["\\\\boxed{{\\\\frac{{1}}{{2}}}}"], answer=["0.5"]))
            """
        )
    )
    proc = _run([sys.executable, str(script)], tmp_path)
    assert _rewards(proc.stdout) == ["[1.0]"]


def test_several_threads_share_one_verifier_in_process():
    verifier = MathVerifier(cache_size=3, timeout_seconds=1.75)  # its own grading process
    outcomes: list[bool] = []
    errors: list[str] = []

    def work(offset: int) -> None:
        try:
            for k in range(6):
                pred, gold, expected = HARD_PAIRS[(offset + k) % len(HARD_PAIRS)]
                outcomes.append(verifier.is_equivalent(pred, gold) is expected)
        except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    verifier.close()
    assert not errors, errors
    assert len(outcomes) == 24 and all(outcomes)


# ---------------------------------------------------------------- when the grading process cannot start


def _one_line_error(verifier: MathVerifier) -> str:
    with pytest.raises(RuntimeError) as info:
        verifier.is_equivalent(r"\frac{1}{2}", "0.5")
    message = str(info.value)
    assert "\n" not in message and "EOFError" not in message, message
    error = info.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), "chained"
    return message


def test_missing_interpreter_is_named_in_one_line(tmp_path: Path):
    missing = str(tmp_path / "no-such-python")
    message = _one_line_error(MathVerifier(python_executable=missing))
    assert f"python_executable={missing!r}" in message
    assert "No such file or directory" in message
    assert "Pass python_executable=" in message


def test_interpreter_that_dies_at_start_up_is_named_with_its_last_error_line(tmp_path: Path):
    broken = tmp_path / "broken-python"
    broken.write_text(
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho 'OSError: broken interpreter' >&2\nexit 3\n"
    )
    broken.chmod(0o755)
    verifier = MathVerifier(python_executable=str(broken))
    message = _one_line_error(verifier)
    assert "exited with code 3 (OSError: broken interpreter)" in message
    assert f"`{broken} -c 'import mcadvantage, math_verify'`" in message
    # Every later call reports the same error rather than hanging or returning wrong verdicts.
    assert "exited with code 3" in _one_line_error(verifier)


def test_missing_math_verify_in_the_grading_process_is_named(monkeypatch):
    # The grading process resolves imports with the caller's sys.path; without site-packages there it
    # cannot import math-verify and says so.
    import math_verify

    if not any(part in math_verify.__file__ for part in ("site-packages", "dist-packages")):
        pytest.skip(f"math-verify is not installed in site-packages here ({math_verify.__file__})")
    verifier = MathVerifier(timeout_seconds=1.3)  # its own grading process
    without_site = [p for p in sys.path if "site-packages" not in p and "dist-packages" not in p]
    with monkeypatch.context() as patch:
        patch.setattr(sys, "path", without_site)
        message = _one_line_error(verifier)
    assert "failed to start: ModuleNotFoundError: No module named 'math_verify'" in message
    # With the path restored the next call starts a working process.
    assert verifier.is_equivalent(r"\frac{1}{2}", "0.5") is True
    verifier.close()


def test_rejects_a_non_string_python_executable():
    with pytest.raises(ValueError, match="python_executable must be the path of a Python interpreter"):
        MathVerifier(python_executable="")


# ---------------------------------------------------------------- forked after use


def _grade_in_fork(verifier: MathVerifier, queue) -> None:
    info = verifier.grading_process_info()
    queue.put((info.get("pid"), verifier.is_equivalent(r"\sqrt{8}", r"2\sqrt{2}")))


@pytest.mark.slow
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_forked_process_starts_its_own_grading_process():
    # A forked copy of the caller must not talk to the parent's grading process over the inherited
    # socket: two processes interleaving requests on one connection read each other's answers.
    verifier = MathVerifier(timeout_seconds=1.4, cache_size=0)  # its own grading process
    assert verifier.is_equivalent(r"\frac{1}{2}", "0.5") is True
    parent_pid = verifier.grading_process_info()["pid"]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_grade_in_fork, args=(verifier, queue))
    child.start()
    child_grader_pid, verdict = queue.get(timeout=120)
    child.join(30)
    assert child.exitcode == 0
    assert verdict is True
    assert child_grader_pid is not None and child_grader_pid != parent_pid
    # The parent's grading process is untouched.
    assert verifier.grading_process_info()["pid"] == parent_pid
    assert verifier.is_equivalent("(x+1)^2", "x^2+2x+1") is True
    verifier.close()


def test_grading_process_that_never_gets_ready_is_stopped_after_startup_timeout(tmp_path: Path):
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    verifier = MathVerifier(python_executable=str(silent), startup_timeout=1.0)
    start = time.monotonic()
    message = _one_line_error(verifier)
    assert time.monotonic() - start < 10
    assert f"({silent}) did not start within 1.0 s" in message
    assert "startup_timeout=" in message


@pytest.mark.slow
def test_spawned_grading_children_do_not_rerun_any_main_module(tmp_path: Path):
    # Where fork is unavailable the grading process spawns its children, and spawn re-runs the parent's
    # __main__. The grading process' __main__ is the -c bootstrap, so nothing of the caller's runs again.
    # The wrapper hides fork from the grading process (it receives `-c BOOTSTRAP root fd`).
    wrapper = tmp_path / "spawn-only-python"
    hide_fork = "import multiprocessing as m; m.get_all_start_methods = lambda: ['spawn']; "
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "{hide_fork}$2" "$3" "$4"\n')
    wrapper.chmod(0o755)
    script = tmp_path / "spawn_only.py"
    script.write_text(
        textwrap.dedent(
            f"""\
            print("MAIN RUN")
            from mcadvantage import MathVerifier
            v = MathVerifier(python_executable={str(wrapper)!r}, timeout_seconds=30.0, num_workers=2)
            pairs = [(pred, gold) for pred, gold, _ in {HARD_PAIRS!r}]
            print("VERDICTS", v.equivalent_batch(pairs))
            """
        )
    )
    proc = _run([sys.executable, str(script)], tmp_path)
    assert proc.stdout.count("MAIN RUN") == 1
    assert f"VERDICTS {[expected for _, _, expected in HARD_PAIRS]}" in proc.stdout


# ---------------------------------------------------------------- interrupted calls, a killed grading process


@pytest.mark.slow
def test_interrupted_call_does_not_shift_later_answers(tmp_path: Path):
    # Ctrl-C while an answer is being graded: its late verdict must not become the answer to the next
    # request (the grading process is in its own session, so Ctrl-C does not stop it too). The grading is made
    # slow on purpose (8 s for one marked answer, through a sitecustomize that every process of the test loads),
    # so the interrupt at 1 s always lands during it, however fast the machine.
    patch_dir = tmp_path / "slow_grading"
    patch_dir.mkdir()
    (patch_dir / "sitecustomize.py").write_text(
        textwrap.dedent(
            """\
            import time

            import mcadvantage.tasks.math_equivalence as _equivalence

            _math_equal = _equivalence._math_equal


            def _slow_math_equal(pred, gold):
                if "10000000!" in pred:
                    time.sleep(8.0)
                return _math_equal(pred, gold)


            _equivalence._math_equal = _slow_math_equal
            """
        )
    )
    script = tmp_path / "interrupt.py"
    script.write_text(
        textwrap.dedent(
            """\
            import signal, threading, time
            from mcadvantage import MathVerifier

            # Python keeps SIGINT ignored when it starts with it ignored (e.g. under a background `nohup` job,
            # as CI may run); a terminal user's Python raises KeyboardInterrupt, so restore that.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            v = MathVerifier(timeout_seconds=20.0, interrupt_in_child=False, cache_size=0)
            v.warmup()
            # A real SIGINT to the main thread, as Ctrl-C delivers it (it interrupts the blocking wait).
            main = threading.main_thread().ident
            threading.Timer(1.0, signal.pthread_kill, args=(main, signal.SIGINT)).start()
            start = time.perf_counter()
            try:
                v.is_equivalent("10000000!", "1")
                print("NOT INTERRUPTED after", round(time.perf_counter() - start, 1), "s")
            except KeyboardInterrupt:
                print("INTERRUPTED")
            print("VERDICTS", [v.is_equivalent(p, g) for p, g in [("x+y", "y+x+1"), ("\\\\sqrt{8}", "2\\\\sqrt{2}")]])
            """
        )
    )
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(patch_dir), old) if p)
    try:
        proc = _run([sys.executable, str(script)], tmp_path)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    assert "INTERRUPTED" in proc.stdout.splitlines(), proc.stdout
    assert "VERDICTS [False, True]" in proc.stdout


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; the death signal is Linux-only"
)
def test_grading_process_killed_from_outside_takes_its_stuck_child_along():
    # E.g. the OOM killer takes the grading process while its child is stuck in C code. The child must not
    # live on (it would burn a core for minutes) and the caller must notice at once, not after its backstop
    # (30 s + the budget): the child used to keep the caller's socket open.
    verifier = MathVerifier(timeout_seconds=4.0, interrupt_in_child=False, memory_limit_mb=None)
    verifier.warmup()
    supervisor = verifier.grading_process_info()["pid"]
    stuck_children: list[int] = []

    def kill_supervisor() -> None:
        stuck_children.extend(children_of(supervisor))
        os.kill(supervisor, 9)

    threading.Timer(1.0, kill_supervisor).start()
    start = time.monotonic()
    assert verifier.is_equivalent("10000000!", "1") is False
    elapsed = time.monotonic() - start
    # 1 s until the kill, a restart, then the retried answer's own 4 s budget.
    assert elapsed < 15, elapsed
    assert stuck_children, "the grading process had no child to kill"
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in stuck_children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in stuck_children)
    assert verifier.grading_process_info()["pid"] != supervisor
    verifier.close()
