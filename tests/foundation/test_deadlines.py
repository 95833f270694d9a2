"""No test's verdict may depend on how fast the machine is (issue 47): a test waits for its event (a state, a log line,
a file, a process's end) with a hang bound that only a hang reaches, HANG_BOUND_S or more, and never asserts on wall
time. This test reads every test file's syntax tree and names, file:line, each literal deadline under that bound:

* a keyword argument that bounds a wait (`timeout=30`, `within=60`, `seconds=90`, ...; Playwright's in
  milliseconds), the same names' defaults in a helper's signature (`def until(condition, timeout=10)`), and the
  numbers passed at those places to the suite's own helpers (`demo.left_behind(30)`);
* `time.monotonic() + 30` (or `time.time() + 30`), whatever it is assigned to;
* `.wait(10)`, `.join(10)`, `wait_for(x, 10)`, `until(..., 10)` and other `wait*`/`until*` calls with a number;
* `pytest.mark.timeout(N)` under HANG_BOUND_S;
* a constant named like a bound (`..._TIMEOUT`, `..._TIMEOUT_S`, `..._WAIT_S`, `HANG_...`; `..._MS` in milliseconds);
* a timed assertion: elapsed wall time held under a number (`time.monotonic() - started < 5`, `took < 8`).

Not counted: a grace period before a kill (a wait in a `try` whose `except TimeoutExpired` kills), a cache entry's
expiry, a `timedelta`, a soak's planned length. A short bound that is right stays, with its reason, in ALLOWED: a
wait that must NOT end (the test proves that something does not happen), a connect probe inside a polling loop that
has its own hang bound, a bound handed to the code under test as its own setting (the test is about what that code
does when its bound runs out). PENDING lists timed assertions in other rooms' files with what their owners are to do.

    .venv/bin/python -m tests.foundation.test_deadlines      # lists what it finds, and stale allow-list entries
"""
from __future__ import annotations

import ast
import configparser
import functools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
HANG_BOUND_S = 600

# Keyword arguments and parameters that bound a wait, in seconds (Playwright's `timeout=` is in milliseconds: it is
# read as such in a call on a page, locator or tab, see _MS_CALLS).
BOUND_NAMES = {"timeout", "timeout_s", "timeout_seconds", "seconds", "within", "within_s", "deadline", "hang",
               "hang_s", "wait_s", "wait_seconds", "bound", "bound_s", "max_wait", "patience"}
# Calls whose `seconds=`/`timeout=` is not a wait: a duration of the data, a setting of the thing built.
NOT_A_WAIT = {"timedelta", "settings", "Settings", "sleep", "relativedelta",
              "add", "set", "set_many", "get_or_set", "touch", "incr",  # Django's cache: an entry's expiry
              "SoakRate"}  # a soak's planned length: data for the planner's arithmetic
# Playwright calls: their `timeout=` is in milliseconds.
_MS_CALLS = {"wait_for", "click", "fill", "goto", "wait_for_url", "wait_for_function", "wait_for_selector",
             "wait_for_load_state", "set_default_timeout", "set_default_navigation_timeout", "check", "press",
             "select_option", "expect_download", "expect_navigation", "expect_popup", "to_be_visible",
             "to_have_text", "to_contain_text"}
WAIT_CALL = re.compile(r"^(wait|join|until)$|^wait_|^_wait|^until_|^_until|^wait_for")
CONSTANT = re.compile(r"(^|_)(TIMEOUT|DEADLINE|WITHIN|HANG|PATIENCE|WAIT)(_|$)")


@dataclass(frozen=True)
class Finding:
    path: str        # relative to the repository, e.g. tests/portal/test_browser.py
    line: int
    function: str    # the enclosing function's (or class's) dotted name, "<module>" at the top
    code: str        # the source of the flagged expression, e.g. "timeout=30"
    seconds: float
    span: tuple = field(default=(), compare=False, repr=False)  # (line, col, end line, end col) of the number

    def key(self) -> tuple[str, str, str]:
        return self.path, self.function, self.code

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code} ({self.seconds:g} s, in {self.function})"


# (file, enclosing function, flagged source) -> why it may stay short. Matching by source rather than by line keeps an
# entry right when other lines move; a changed line must be looked at again.
_OWN_LIMIT = "the command's own time limit, the setting under test: the command (a long sleep) must run into it"
ALLOWED: dict[tuple[str, str, str], str] = {
    ("tests/agent/test_agent_process.py", "test_a_command_past_its_timeout_is_stopped_and_reported_as_a_timeout",
     "timeout=0.5"): _OWN_LIMIT,
    ("tests/agent/test_agentlink.py", "test_a_command_past_its_timeout_is_given_up", "timeout=0.3"): _OWN_LIMIT,
    ("tests/runners/test_ssh_simnode.py", "test_a_slow_node_runs_into_the_command_time_limit", "timeout=0.5"):
        _OWN_LIMIT,
    ("tests/runners/test_ssh_simnode.py", "test_a_command_past_its_time_limit_is_stopped_with_its_output_kept",
     "timeout=10"): _OWN_LIMIT + " (`sleep 30`); 10 s leave the `echo` before it time to arrive on a loaded machine",
    ("tests/agent/test_control_plane.py", "test_a_call_past_its_deadline_is_never_handed_out", "within=0.05"):
        "the call's answer deadline, the setting under test: it must pass before the answer comes",
    ("tests/agent/test_control_plane.py", "test_a_word_wakes_one_waiter_and_without_redis_the_wait_is_a_short_sleep",
     "wakeup.wait(name, 0.2)"): "a wait that must not end: the word was heard once, a second waiter gets nothing",
    ("tests/client/test_failures.py", "test_a_server_that_never_sends_a_token_times_out_with_a_reason",
     "timeout=0.5"): "the client's own request timeout against a server that never answers: the setting under test",
    ("tests/client/test_failures.py", "test_a_server_that_never_reads_the_request_times_out_and_the_run_goes_on",
     "timeout=1.0"): "the client's own request timeout against a server that never reads: the setting under test",
    ("tests/client/test_failures.py", "test_the_run_goes_on_after_requests_fail", "timeout=5"):
        "the client's own request timeout, which the three requests the server leaves hanging must run into; the two "
        "it answers (a mock answer on 127.0.0.1) have 5 s",
    ("tests/orchestration/test_cancel_and_reattach.py", "_look_at_the_node", "timeout=10"):
        "a look at a node that is away by design (the step kind's own bound): the unreachable node is the point",
    ("tests/orchestration/test_cancel_and_reattach.py", "<module>", "timeout=10"):
        "the same step kind's cancel, a look at the node that is away by design",
    ("tests/runners/conftest.py", "sshd", "timeout=0.5"):
        "a connect probe in a polling loop that has its own hang bound: refused at once while nobody listens",
    ("tests/sim/conftest.py", "SimServer.wait_healthy", "timeout=1"):
        "a /health probe in a polling loop that has its own hang bound; a probe that times out is tried again",
    ("tests/security/test_sessions_gunicorn.py", "portal", "timeout=10"):
        "a probe of the login page in a polling loop that has its own hang bound; one that times out is tried again",
    ("tests/topology/netns.py", "CustomerNetwork.forward.accept", "timeout=10"):
        "a socket connect to a port on this machine: refused or accepted at once",
    ("tests/topology/netns.py", "CustomerNetwork", "timeout=5"):
        "clean-up's grace period between SIGTERM and SIGKILL of what runs in the namespace: decides no verdict",
}


# Timed assertions in other rooms' files, which this room may not rewrite (issue 47 lets it change a deadline's literal
# there, nothing else): each says what its owner is to do. They fail on a loaded enough machine; they are listed here
# so that the scan stays green for everything else and no NEW one comes in unseen. Remove an entry once it is fixed
# (test_every_pending_timed_assertion_is_still_there says when).
PENDING: dict[tuple[str, str, str], str] = {
    ("tests/orchestration/test_cancel_and_reattach.py",
     "test_a_synchronous_step_is_interrupted_by_a_cancel_and_its_cleanup_still_runs", "took < 8"):
        "tests/orchestration: let the step's remote wait be `sleep 900` (its soft_time_limit above it) and bound "
        "the cancel at 600 s, so that only a cancel that waited for the sleep reaches the bound",
    ("tests/orchestration/test_evidence_edges.py",
     "test_a_long_ssh_outage_is_followed_again_within_seconds_of_its_end_and_never_errs_a_running_step",
     "stalled < 8"):
        "tests/orchestration: how soon a run is followed again after an outage is a timing claim: count the failed "
        "looks after the outage's end in the log (at most two at the capped back-off), or move it to benchmarks/",
}


def _number(node: ast.AST) -> float | None:
    """The value of a numeric literal or of arithmetic on literals (`4 * 60`, `90_000`), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _number(node.left), _number(node.right)
        if left is None or right is None:
            return None
        try:
            return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right,
                    ast.Div: left / right}[type(node.op)]
        except ZeroDivisionError:
            return None
    return None


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _dotted(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Call):
        return _dotted(func.func)
    return ""


def _grace_then_kill(handler: ast.ExceptHandler) -> bool:
    """`except subprocess.TimeoutExpired: <kill>`: the wait before it is a grace period for a process asked to end,
    whose expiry the test handles by killing it; how long it is decides no verdict."""
    caught = _dotted(handler.type) if handler.type is not None else ""
    return caught.endswith("TimeoutExpired") and any(
        isinstance(node, ast.Call) and _name(node.func) in {"kill", "killpg", "terminate"} for node in ast.walk(handler))


def _is_playwright(node: ast.Call) -> bool:
    """A call on a page, tab or locator (Playwright, milliseconds), not on a process or a helper of ours."""
    return bool(re.search(r"(page|tab|bob|phone|locator|get_by_\w+|first|nth|expect)\b", _dotted(node.func)))


def _is_clock(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func) in {"time.monotonic", "time.time", "monotonic",
                                                                    "time.perf_counter"}


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, source: str, helpers: dict | None = None, methods: frozenset = frozenset()):
        self.path, self.source, self.scope = path, source, []
        self.helpers, self.methods = helpers or {}, methods
        self.found: list[Finding] = []
        self.elapsed: set[str] = set()
        self.grace = False  # inside a `try` whose TimeoutExpired ends in a kill: a grace period, not a verdict

    def _add(self, node: ast.AST, number: ast.AST, seconds: float, limit: float = HANG_BOUND_S,
             name: str = "") -> None:
        """`name` set: the node is the value of the keyword or parameter `name` (the finding reads `name=value`)."""
        if 0 <= seconds < limit and not self.grace:
            code = ast.get_source_segment(self.source, node) or ast.unparse(node)
            code = " ".join(code.split())
            code = f"{name}={code}" if name else code
            self.found.append(Finding(self.path, node.lineno, ".".join(self.scope) or "<module>", code,
                                      seconds if limit == HANG_BOUND_S else seconds / 1000,
                                      (number.lineno, number.col_offset, number.end_lineno, number.end_col_offset)))

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Compare(self, node: ast.Compare) -> None:
        """A timed assertion: elapsed wall time held under a literal (`time.monotonic() - started < 5`). A lower bound
        (`took >= modelled`) holds on any machine and is not one."""
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
            if isinstance(op, (ast.Lt, ast.LtE)) and self._elapsed(left):
                bound = right
            elif isinstance(op, (ast.Gt, ast.GtE)) and self._elapsed(right):
                bound = left
            else:
                continue
            value = _number(bound)
            if value is not None:
                self._add(node, bound, value)
        self.generic_visit(node)

    def _elapsed(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.elapsed
        return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_clock(node.left)

    def visit_Try(self, node: ast.Try) -> None:
        if any(_grace_then_kill(handler) for handler in node.handlers):
            outer, self.grace = self.grace, True
            for statement in node.body:
                self.visit(statement)
            self.grace = outer
            for rest in (*node.handlers, *node.orelse, *node.finalbody):
                self.visit(rest)
        else:
            self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node)

    def visit_FunctionDef(self, node) -> None:
        outer = self.elapsed
        # names that hold elapsed wall time in this function: `took = time.monotonic() - started`
        self.elapsed = outer | {target.id for statement in ast.walk(node) if isinstance(statement, ast.Assign)
                                and self._elapsed(statement.value)
                                for target in statement.targets if isinstance(target, ast.Name)}
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
        pairs += [(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default is not None]
        for arg, default in pairs:
            value = _number(default)
            if value is not None and arg.arg in BOUND_NAMES:
                self._add(default, default, value, name=arg.arg)
        self._scoped(node)
        self.elapsed = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name, dotted = _name(node.func), _dotted(node.func)
        if dotted.endswith("mark.timeout") and node.args:
            value = _number(node.args[0])
            if value is not None:
                self._add(node, node.args[0], value)
        elif name not in NOT_A_WAIT:
            in_ms = name in _MS_CALLS and isinstance(node.func, ast.Attribute) and _is_playwright(node)
            for keyword in node.keywords:
                value = _number(keyword.value) if keyword.arg in BOUND_NAMES else None
                if value is not None:
                    self._add(keyword.value, keyword.value, value, HANG_BOUND_S * 1000 if in_ms else HANG_BOUND_S, keyword.arg)
            if WAIT_CALL.search(name) and not in_ms:
                numbers = [arg for arg in node.args if _number(arg) is not None]
                if numbers:  # the bound is the last number: wait_for_running_step(gate, seconds)
                    self._add(node, numbers[-1], _number(numbers[-1]))
            else:
                # a helper of the suite whose parameter at that place bounds a wait: `demo.left_behind(30)`
                for index in self.helpers.get(name, ()):
                    place = index - (1 if isinstance(node.func, ast.Attribute) and index > 0
                                     and name in self.methods else 0)
                    if place < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[:place + 1]):
                        value = _number(node.args[place])
                        if value is not None:
                            self._add(node, node.args[place], value)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Add) and (_is_clock(node.left) or _is_clock(node.right)):
            number = node.right if _is_clock(node.left) else node.left
            value = _number(number)
            if value is not None:
                self._add(node, number, value)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        value = _number(node.value)
        if value is not None:
            for target in node.targets:
                if isinstance(target, ast.Name) and CONSTANT.search(target.id.upper()):
                    in_ms = target.id.upper().endswith("_MS")
                    self._add(node, node.value, value, HANG_BOUND_S * 1000 if in_ms else HANG_BOUND_S)
        self.generic_visit(node)


def _helpers(trees) -> tuple[dict[str, set[int]], frozenset]:
    """The suite's own functions with a parameter that bounds a wait, by name: the positions of those parameters
    (`def left_behind(self, within=30)` → {"left_behind": {1}}), and which of them are methods (self first)."""
    helpers: dict[str, set[int]] = {}
    methods = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not WAIT_CALL.search(node.name):
                names = [arg.arg for arg in node.args.posonlyargs + node.args.args]
                # (not `seconds`: a helper's `seconds` is as often a duration of the data as a wait's bound)
                places = {index for index, name in enumerate(names) if name in BOUND_NAMES - {"seconds"}}
                if places:
                    helpers.setdefault(node.name, set()).update(places)
                    if names and names[0] in ("self", "cls"):
                        methods.add(node.name)
    return helpers, frozenset(methods)


def scan(files=None) -> list[Finding]:
    found: list[Finding] = []
    here = Path(__file__).resolve()
    sources = {file: file.read_text(encoding="utf-8") for file in sorted(files or TESTS.rglob("*.py"))
               if file.resolve() != here}
    trees = {file: ast.parse(source, filename=str(file)) for file, source in sources.items()}
    helpers, methods = _helpers(trees.values())
    for file, source in sources.items():
        where = file.resolve()
        scanner = _Scanner((where.relative_to(ROOT) if where.is_relative_to(ROOT) else where).as_posix(), source,
                           helpers, methods)
        scanner.visit(trees[file])
        found.extend(scanner.found)
    return found


@functools.cache
def _suite() -> tuple[Finding, ...]:
    """The whole suite's findings, read once per session (the tests below share them)."""
    return tuple(scan())


def unexplained(found: list[Finding]) -> list[Finding]:
    return [finding for finding in found if finding.key() not in ALLOWED and finding.key() not in PENDING]


def stale(found: list[Finding], listed=None) -> list[tuple[str, str, str]]:
    keys = {finding.key() for finding in found}
    return [key for key in (ALLOWED if listed is None else listed) if key not in keys]


# --- the tests --------------------------------------------------------------------------------------------------

def test_no_test_waits_for_a_run_step_server_or_process_under_ten_minutes():
    found = unexplained(_suite())
    assert not found, (
        f"{len(found)} wall-clock deadline(s) under {HANG_BOUND_S} s: on a loaded machine the event comes later, and "
        "the test fails though nothing is wrong. Wait for the event with a bound of at least "
        f"{HANG_BOUND_S} s whose message says \"hung\" and what it waited for; move a timing assertion to "
        "benchmarks/; or, if the bound must be short (a wait that must not end, a socket connect), add it to "
        "ALLOWED in tests/foundation/test_deadlines.py with the reason:\n" + "\n".join(map(str, found)))


def test_every_allowed_short_deadline_still_exists_and_says_why():
    assert all(reason.strip() for reason in ALLOWED.values())
    gone = stale(_suite())
    assert not gone, "ALLOWED names deadlines that are no longer there (remove them):\n" + "\n".join(map(str, gone))


def test_every_pending_timed_assertion_is_still_there_and_says_what_is_to_be_done():
    assert all(reason.strip() for reason in PENDING.values())
    done = stale(_suite(), PENDING)
    assert not done, "PENDING names timed assertions that are gone (remove them):\n" + "\n".join(map(str, done))


def test_the_per_test_timeout_is_above_every_hang_bound_it_contains():
    """pytest-timeout ends a test at pytest.ini's `timeout`, with a stack dump instead of the test's own "hung"
    message: it must be longer than one hang bound plus the work around it. A test whose own bound is longer says
    so with a larger pytest.mark.timeout (its module's or its own)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "pytest.ini")
    per_test = float(config["pytest"]["timeout"])
    assert per_test > HANG_BOUND_S, f"pytest.ini's timeout {per_test:g} s is not above the hang bound {HANG_BOUND_S} s"
    problems = []
    for file in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        module_mark = _timeout_mark(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                mark = _timeout_mark(node.decorator_list, decorators=True) or module_mark or per_test
                longest = max(_bounds(node), default=0)
                if longest >= mark:
                    problems.append(f"{file.relative_to(ROOT)}:{node.lineno}: {node.name} waits up to "
                                    f"{longest:g} s under a per-test timeout of {mark:g} s")
    assert not problems, "\n".join(problems)


def _timeout_mark(nodes, decorators: bool = False) -> float | None:
    """The N of pytest.mark.timeout(N) in a module's `pytestmark` or in a function's decorators."""
    for node in nodes:
        if not decorators and not (isinstance(node, ast.Assign)
                                   and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)):
            continue
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and _dotted(call.func).endswith("mark.timeout") and call.args:
                value = _number(call.args[0])
                if value is not None:
                    return value
    return None


def _bounds(function: ast.AST):
    """Literal wait bounds, in seconds, written in a test function's own body: `timeout=N` of a call that is not
    Playwright's (milliseconds), the last number of a wait*/until* call, `time.monotonic() + N`."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in _MS_CALLS and _is_playwright(node):
                continue
            for keyword in node.keywords:
                value = _number(keyword.value) if keyword.arg == "timeout" else None
                if value is not None:
                    yield value
            numbers = [value for value in map(_number, node.args) if value is not None]
            if WAIT_CALL.search(name) and numbers:
                yield numbers[-1]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and (_is_clock(node.left)
                                                                              or _is_clock(node.right)):
            value = _number(node.right if _is_clock(node.left) else node.left)
            if value is not None:
                yield value


def test_the_scanner_finds_each_kind_of_deadline(tmp_path: Path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import time, pytest\n"
        "LOG_TIMEOUT_S = 30\n"
        "PAGE_TIMEOUT_MS = 90_000\n"
        "def until(condition, timeout: float = 10):\n"
        "    deadline = time.monotonic() + timeout\n"
        "@pytest.mark.timeout(120)\n"
        "def test_x(proc, thread, page):\n"
        "    deadline = time.monotonic() + 5 * 60\n"
        "    proc.wait(10)\n"
        "    thread.join(timeout=20)\n"
        "    wait_for(proc, 'ready', 30)\n"
        "    page.locator('#x').wait_for(timeout=15_000)\n"
        "    subprocess.run(['true'], timeout=60)\n"
        "    proc.wait(timeout=600)\n"                       # a hang bound: not a finding
        "    page.locator('#x').wait_for(timeout=600_000)\n"  # the same in milliseconds
        "    datetime.timedelta(seconds=5)\n"                 # data, not a wait
        "    cache.add('key', 1, timeout=60)\n"               # a cache entry's expiry, not a wait
        "    started = time.monotonic()\n"
        "    took = time.monotonic() - started\n"
        "    assert took < 8 and took >= 1\n"                 # a timed assertion; a lower bound is not one
        "    assert time.monotonic() - started < 600\n"       # a hang bound
        "    try:\n"
        "        proc.wait(timeout=15)\n"                     # a grace period before the kill below
        "    except subprocess.TimeoutExpired:\n"
        "        proc.kill()\n"
    )
    codes = {(finding.line, finding.code) for finding in scan([sample])}
    assert codes == {(2, "LOG_TIMEOUT_S = 30"), (3, "PAGE_TIMEOUT_MS = 90_000"), (4, "timeout=10"),
                     (6, "pytest.mark.timeout(120)"), (8, "time.monotonic() + 5 * 60"), (9, "proc.wait(10)"),
                     (10, "timeout=20"), (11, "wait_for(proc, 'ready', 30)"), (12, "timeout=15_000"),
                     (13, "timeout=60"), (20, "took < 8")}


if __name__ == "__main__":
    found = scan()
    for finding in unexplained(found):
        print(finding)
    for key in stale(found):
        print("stale allow-list entry:", key, file=sys.stderr)
    for key, what in PENDING.items():
        print("pending:", ":".join(key), "--", what, file=sys.stderr)
