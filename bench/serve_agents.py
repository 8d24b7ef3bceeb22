"""Real agent frameworks through ``unsee serve``, each with its own defaults
(issue 49's "Done when"; docs/serve.md, "Agents").

    make serve-agents                  # from a fresh clone: the venvs, then this bench
    python -m unsee.bench.serve_agents --model qwen2.5-1.5b [--scenarios a,b] [--timeout 600]
    python -m unsee.bench.serve_agents --table out/serve-agents/results.json   # the table again

The server runs as a user starts it, ``unsee serve --engine llamacpp --model
qwen2.5-1.5b`` with no other option, in a process of its own on loopback.
Each scenario (:data:`SCENARIOS`) is a fresh process of the clients' venv
running bench/serve_agents_clients.py: the frameworks speak only HTTP, and
their pins (constraints/clients.txt, constraints/llamaindex.txt) are not the
project's. Between the clients and the server sits a recording proxy in this
process, so that every exchange (request body, status, response body) is kept
per scenario in ``exchanges.jsonl``: a refused field is reported as the
server answered it, whatever the framework made of the error. The calls the
server parsed are counted from its answers, the calls the tool ran from the
client's side.

A scenario is ``ok`` when it raised nothing, answered, ran its tool where the
prompt needs one (the goal's scenario: at least 9 of its 10 prompts), gave a
value of its schema where it asks for a structured output, and, where it
deletes an item, the conversation's digest equals its twin's. Progress lines
go to stderr; ``results.json`` and ``table.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from unsee.bench import options

ROOT = Path(__file__).resolve().parents[1]
CLIENT_SCRIPT = Path(__file__).resolve().parent / "serve_agents_clients.py"
RESULT_MARK = "SERVE_AGENTS_RESULT "


@dataclass(frozen=True)
class Scenario:
    """One client and configuration: its name, what the table calls it, the venv it runs in
    (``clients`` or ``llamaindex``), and what it must show to be ``ok``."""

    name: str
    client: str
    configuration: str
    venv: str = "clients"
    needs_tool: bool = True
    structured: bool = False
    twin: bool = False
    #: the goal's scenario: this many of its prompts must give a parsed call
    at_least: int | None = None


SCENARIOS = (
    Scenario("agents-responses", "OpenAI Agents SDK `Runner`", "`OpenAIResponsesModel`, a function tool, auto"),
    Scenario("agents-chat", "OpenAI Agents SDK `Runner`", "`OpenAIChatCompletionsModel`, a function tool, auto"),
    Scenario("agents-session", "OpenAI Agents SDK `Runner`",
             "`OpenAIConversationsSession`, a tool, 3 turns; the first user message deleted, then a twin "
             "written without it", twin=True),
    Scenario("agents-output-type", "OpenAI Agents SDK `Runner`", "`output_type` (a pydantic model), Responses",
             needs_tool=False, structured=True),
    Scenario("langgraph-react", "LangGraph `create_react_agent`", "`ChatOpenAI(base_url=...)`, a tool, auto"),
    Scenario("langchain-structured", "LangChain `with_structured_output`",
             "`ChatOpenAI(base_url=...)`, its default method", needs_tool=False, structured=True),
    Scenario("pydantic-ai-chat", "Pydantic AI `Agent`", "`OpenAIChatModel`, a tool"),
    Scenario("pydantic-ai-responses", "Pydantic AI `Agent`", "`OpenAIResponsesModel`, a tool"),
    Scenario("pydantic-ai-structured", "Pydantic AI `Agent`", "`OpenAIChatModel`, `output_type` (its default: "
             "an output tool)", needs_tool=False, structured=True),
    Scenario("smolagents", "smolagents `ToolCallingAgent`", "`OpenAIServerModel`, a tool (`max_steps=4`)"),
    Scenario("llamaindex", "LlamaIndex `FunctionAgent`", "`OpenAILike(is_function_calling_model=True)`, a tool",
             venv="llamaindex"),
    Scenario("openai-auto", "`openai` chat completions", "10 tool-needing prompts, tools given, auto",
             at_least=9),
    Scenario("openai-required", "`openai` chat completions",
             "the same 10 prompts, `tool_choice: required` (the family's grammar writes the call)", at_least=9),
)


def get_scenario(name: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name)


# ------------------------------------------------------------ the recording proxy


#: headers a proxy does not pass on: they describe one hop (the body is re-framed whole)
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
               "proxy-connection", "accept-encoding"}
#: the most of a body an exchange keeps (a streamed turn's events are long)
KEEP_CHARS = 20000


class Recorder:
    """The exchanges seen so far, each tagged with the scenario that sent it, and the
    requests still in flight (a client killed at its timeout leaves its request running
    on the server, and the next scenario would queue behind it)."""

    def __init__(self) -> None:
        self.lock, self.scenario, self.exchanges, self.in_flight = threading.Lock(), "", [], 0

    def start(self) -> str:
        with self.lock:
            self.in_flight += 1
            return self.scenario

    def add(self, scenario: str, exchange: dict) -> None:
        with self.lock:
            self.in_flight -= 1
            self.exchanges.append({"scenario": scenario, **exchange})

    def wait_idle(self, timeout: float) -> float:
        """Until no request is in flight, at most ``timeout`` seconds; the seconds waited."""
        started = time.monotonic()
        while self.in_flight and time.monotonic() - started < timeout:
            time.sleep(0.5)
        return time.monotonic() - started


def get_body(raw: bytes):
    """A body as JSON where it is, else as text (cut to KEEP_CHARS)."""
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text) if len(text) <= KEEP_CHARS else text[:KEEP_CHARS]
    except ValueError:
        return text[:KEEP_CHARS]


def start_proxy(upstream_port: int, recorder: Recorder) -> tuple[ThreadingHTTPServer, str]:
    """A loopback proxy to the server that forwards each request whole and records it.
    A streamed answer is forwarded once it is complete (the clients read it as usual)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size) if size else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            started, scenario = time.perf_counter(), recorder.start()
            upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=3600)
            try:
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                reply = upstream.getresponse()
                data, status, reply_headers = reply.read(), reply.status, reply.getheaders()
            except OSError as exc:  # the server died or hung up: the client sees a 502, the record says why
                data, status, reply_headers = json.dumps({"proxy_error": repr(exc)}).encode(), 502, []
            finally:
                upstream.close()
            recorder.add(scenario, {"method": self.command, "path": self.path, "status": status,
                          "seconds": round(time.perf_counter() - started, 3),
                          "request": get_body(body) if body else None, "response": get_body(data)})
            self.send_response(status)
            for key, value in reply_headers:
                if key.lower() not in HOP_HEADERS:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = forward

        def log_message(self, *args) -> None:  # the exchanges are recorded, not printed
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy, f"http://127.0.0.1:{proxy.server_address[1]}/v1"


# ------------------------------------------------------- what the server answered


def get_events(text: str) -> list[dict]:
    """The JSON events of a server-sent-events body (``data: {...}`` lines)."""
    events = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            try:
                events.append(json.loads(line[5:]))
            except ValueError:
                pass
    return events


def count_calls(response) -> int:
    """The function calls the server parsed in one answer: a chat completion's ``tool_calls``,
    a response's ``function_call`` items, or the same in a stream's events."""
    if isinstance(response, str):
        events = get_events(response)
        done = [e for e in events if e.get("type") == "response.output_item.done"]
        if done:
            return sum(e.get("item", {}).get("type") == "function_call" for e in done)
        return sum(bool(call.get("id")) for e in events for choice in e.get("choices") or []
                   for call in (choice.get("delta") or {}).get("tool_calls") or [])
    if not isinstance(response, dict):
        return 0
    if "choices" in response:
        return sum(len((c.get("message") or {}).get("tool_calls") or []) for c in response["choices"])
    return sum(item.get("type") == "function_call" for item in response.get("output") or [])


def is_model_request(exchange: dict) -> bool:
    return exchange["method"] == "POST" and exchange["path"].rstrip("/").endswith(("/responses", "/chat/completions"))


def summarise_exchanges(exchanges: list[dict]) -> dict:
    """One scenario's exchanges: how many, the calls the server parsed, and each refusal or
    failure with its request and answer (the evidence a server fix starts from)."""
    model = [e for e in exchanges if is_model_request(e)]
    failed = [e for e in exchanges if e["status"] >= 400]
    return {"requests": len(exchanges), "model_requests": len(model),
            "server_calls": sum(count_calls(e["response"]) for e in model if e["status"] < 400),
            "failures": [{"method": e["method"], "path": e["path"], "status": e["status"],
                          "request": e["request"], "response": e["response"]} for e in failed]}


# ------------------------------------------------------------------ the verdict


def judge(scenario: Scenario, record: dict) -> tuple[bool, str]:
    """Whether a scenario met its bar, and the reason where it did not."""
    if record.get("timed_out"):
        return False, "timed out"
    if record.get("error"):
        error = record["error"]
        return False, f"{error.get('status') or error.get('type')}: {error.get('message', '')}"
    if scenario.at_least is not None:
        got = record.get("prompts_with_call", 0)
        return got >= scenario.at_least, f"{got} of {record.get('prompts')} prompts gave a parsed call"
    if not str(record.get("answer") or "").strip():
        return False, "no answer"
    if scenario.needs_tool and not record.get("tool_calls"):
        written = "get_weather" in str(record.get("answer"))  # the model wrote the call, as text
        return False, "the tool was never called" + (": the call came back as text" if written else "")
    if scenario.structured and not record.get("structured"):
        return False, "the output is not a value of the schema"
    twin = record.get("twin") or {}
    digests = twin.get("digests") or [None, "not compared"]
    if scenario.twin and not (digests[0] == digests[1] and twin.get("items_equal")):
        return False, (f"after the DELETE, not its twin: digests {'equal' if digests[0] == digests[1] else 'differ'}, "
                       f"items {'equal' if twin.get('items_equal') else 'differ'}")
    if scenario.twin and twin.get("next_equal") is False:  # a record of this version: the next turn on both
        return False, f"after the DELETE, the next turn is not its twin's: {get_twin_words(twin)}"
    return True, ""


# ----------------------------------------------------------------------- running


def get_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, store: Path, port: int, log: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """``unsee serve`` as a user starts it (-P: the checkout's ./unsee/ never shadows the install),
    with ``extra`` options where a bench names some."""
    command = [sys.executable, "-P", "-m", "unsee.impl.cli", "serve", "--engine", "llamacpp", "--model", model,
               "--store", str(store), "--port", str(port), *extra]
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(process: subprocess.Popen, url: str, timeout: float, log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"unsee serve exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"unsee serve did not answer within {timeout:.0f} s; see {log}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get_result(stdout: str) -> dict | None:
    """The client's record: its last ``SERVE_AGENTS_RESULT`` line."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARK)]
    return json.loads(lines[-1][len(RESULT_MARK):]) if lines else None


def run_client(scenario: Scenario, python: str, url: str, model: str, timeout: float, logs: Path) -> dict:
    """The scenario in a process of its own; its record, with the wall time, or why none came."""
    command = [python, str(CLIENT_SCRIPT), scenario.name, "--base-url", url, "--served-model", model]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": "", "OPENAI_API_KEY": "unused"})
        stdout, stderr, timed_out, rc = done.stdout, done.stderr, False, done.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, timed_out, rc = (exc.stdout or b"").decode(errors="replace") if isinstance(
            exc.stdout, bytes) else exc.stdout or "", (exc.stderr or b"").decode(errors="replace") if isinstance(
            exc.stderr, bytes) else exc.stderr or "", True, None
    wall = time.perf_counter() - started
    (logs / f"{scenario.name}.log").write_text(f"$ {' '.join(command)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}")
    record = get_result(stdout) or {"scenario": scenario.name, "error": None if timed_out else {
        "type": "no result", "status": None, "message": (stderr.strip().splitlines() or [f"exit {rc}"])[-1][:600]}}
    return {**record, "wall_s": round(wall, 1), "timed_out": timed_out, "rc": rc}


def say(text: str) -> None:
    print(f"serve_agents: {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def run_scenarios(args: argparse.Namespace, work: Path, out: Path) -> tuple[list[dict], list[dict]]:
    """The server, then each scenario in turn through the proxy; the records and every exchange."""
    recorder, proxy = Recorder(), None
    if args.server_port:  # a server already running (one being worked on): none started
        port, server = args.server_port, None
    else:
        port = get_free_port()
        server = start_server(args.model, work / "store", port, out / "server.log",
                              tuple(getattr(args, "server_options", ())))
    try:
        if server is not None:
            say(f"unsee serve --engine llamacpp --model {args.model} "
                f"{' '.join(getattr(args, 'server_options', ()))}: starting")
            wait_ready(server, f"http://127.0.0.1:{port}/v1", args.start_timeout, out / "server.log")
        proxy, url = start_proxy(port, recorder)
        records = []
        for scenario in [get_scenario(name) for name in args.scenarios]:
            say(f"{scenario.name}: {scenario.client}, {scenario.configuration}")
            recorder.scenario = scenario.name
            python = args.clients_python if scenario.venv == "clients" else args.llamaindex_python
            record = run_client(scenario, python, url, args.model, args.timeout, out / "logs")
            if recorder.in_flight:  # its client gave up: the server still works on its request
                record["server_busy_after_s"] = round(recorder.wait_idle(args.timeout), 1)
            if server is not None and server.poll() is not None:
                record.setdefault("notes", []).append(f"unsee serve exited with {server.returncode}")
            record |= summarise_exchanges([e for e in recorder.exchanges if e["scenario"] == scenario.name])
            record["ok"], record["why"] = judge(scenario, record)
            say(f"{scenario.name}: {'ok' if record['ok'] else 'failed: ' + record['why'][:160]} "
                f"({record['wall_s']} s)")
            records.append(record)
            if server is not None and server.poll() is not None:
                break
        return records, recorder.exchanges
    finally:
        if proxy is not None:
            proxy.shutdown()
        if server is not None:
            stop(server)


def get_label(args: argparse.Namespace, argv: list[str]) -> dict:
    """Build, model, engine, CPU, command, load: what a row needs to be read."""
    from unsee.bench.llamacpp_exact_batch import get_cpu_name

    try:
        build = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                               cwd=ROOT, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        build = "not recorded"
    return {"build": build, "model": args.model, "engine": "llamacpp", "cpu": get_cpu_name(),
            "cores": os.cpu_count(), "command": "python -m unsee.bench.serve_agents " + " ".join(argv),
            "load_average": round(os.getloadavg()[0], 1)}


# ------------------------------------------------------------------------ the table


def get_first_words(text: str, words: int = 12) -> str:
    """An answer's first words; one with backticks (a call written as a fenced block) as a
    code span whose fence is longer than any run of backticks in it, so it shows as written."""
    parts = " ".join(str(text or "").split()).split(" ")
    shown = " ".join(parts[:words]) + (" ..." if len(parts) > words else "")
    if "`" not in shown:
        return shown
    fence = "`" * (max(len(run) for run in re.findall(r"`+", shown)) + 1)
    return f"{fence} {shown} {fence}"


def get_cell(text: str) -> str:
    """Text fit for a markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def get_tool_cell(scenario: Scenario | None, record: dict) -> str:
    if scenario is not None and scenario.at_least is not None:
        return f"{record.get('prompts_with_call', 0)} of {record.get('prompts', '?')} prompts"
    runs, parsed = len(record.get("tool_calls") or []), record.get("server_calls", 0)
    if scenario is not None and not scenario.needs_tool:
        return f"not needed ({parsed} parsed)" if parsed else "not needed"
    return f"{'yes' if runs else 'no'} ({runs} run, {parsed} parsed by the server)"


def get_failure_cell(record: dict, chars: int = 200) -> str:
    """The first refusal the server sent, as the server worded it (cut to ``chars``: a
    refused value is quoted whole), else the client's error; a conversation's id as ``{id}``."""
    for failure in record.get("failures") or []:
        response, path = failure["response"], re.sub(r"/conv_[0-9a-zA-Z]+", "/{id}", failure["path"])
        error = response.get("error") if isinstance(response, dict) else None
        if isinstance(error, dict):
            param = f" (`{error['param']}`)" if error.get("param") else ""
            return get_cut(f"{failure['status']} on {path}{param}: {error.get('message', '')}", chars)
        return get_cut(f"{failure['status']} on {path}: {response}", chars)
    return get_cut(record.get("why", ""), chars) if not record.get("ok") else ""


def get_cut(text: str, chars: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= chars else text[:chars].rstrip() + " ..."


def get_twin_words(twin: dict) -> str:
    """How the conversation after its DELETE compares with its twin."""
    digests = twin.get("digests") or [None, None]
    digest = ("no digest on either (items only wait)" if digests == [None, None] else
              "digest equal" if digests[0] == digests[1] else "digest differs")
    words = f"twin: {digest}, items {'equal' if twin.get('items_equal') else 'differ'}"
    if "next_answers" in twin:  # the next turn run on both
        answers, after = twin["next_answers"], twin.get("digests_after") or [None, None]
        words += (f"; next turns: answers {'equal' if answers[0::2] == answers[1::2] else 'differ'}, digest "
                  f"{'equal' if after[0] == after[1] and after[0] else 'differs' if after[0] != after[1] else 'none'}")
    return words


def get_wall_cell(record: dict) -> str:
    busy = record.get("server_busy_after_s")
    return f"{record.get('wall_s', 0):.0f} s" + (f" (the server busy {busy:.0f} s more)" if busy else "")


def format_label(label: dict) -> str:
    """The label line docs/serve.md's figures carry (bench/options.py's FIGURE_LABEL)."""
    build, dirty = label["build"].removesuffix("-dirty"), label["build"].endswith("-dirty")
    return (f"> build `{build}`{' plus uncommitted changes' if dirty else ''} · attention llama.cpp flash attention, exact kernels, the server's "
            f"default threads · dtype {label['model']} Q4_K_M, f16 KV · CPU {label['cpu']}, "
            f"{label['cores']} cores shared (load average {label['load_average']} at the start) · "
            f"command `{label['command']}`")


def format_table(result: dict) -> str:
    """The markdown of docs/serve.md's "Agents" table: a row per scenario, from a results JSON."""
    lines = [format_label(result["label"]), "",
             "| client | configuration | result | tool called | answer (first words) | error | wall |",
             "|---|---|---|---|---|---|---:|"]
    verdicts = []
    for record in result["records"]:
        scenario = next((s for s in SCENARIOS if s.name == record["scenario"]), None)
        if scenario is not None:  # judged by this version's rules (a results file may be older)
            record = {**record, **dict(zip(("ok", "why"), judge(scenario, record), strict=True))}
        client, configuration = (scenario.client, scenario.configuration) if scenario else (record["scenario"], "")
        verdict = "ok" if record.get("ok") else "timed out" if record.get("timed_out") else "failed"
        verdicts.append(verdict)
        if scenario is not None and scenario.twin and record.get("twin"):
            verdict += f"; {get_twin_words(record['twin'])}"
        lines.append("| " + " | ".join(get_cell(c) for c in (
            client, configuration, verdict, get_tool_cell(scenario, record),
            get_first_words(record.get("answer", "")), get_failure_cell(record),
            get_wall_cell(record))) + " |")
    ok = sum(verdict.startswith("ok") for verdict in verdicts)
    lines += ["", f"{ok} of {len(result['records'])} scenarios ok; the whole run took "
                  f"{result.get('wall_s', 0) / 60:.1f} min."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.get_parser("serve_agents", __doc__)
    options.add_model(parser)  # the model unsee serve runs on llama.cpp: the measured one is qwen2.5-1.5b
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--scenarios", type=lambda t: t.split(","), default=names, help=f"of {', '.join(names)}")
    parser.add_argument("--clients-python", default=".venv-clients/bin/python",
                        help="the interpreter with the frameworks (make serve-agents builds it)")
    parser.add_argument("--llamaindex-python", default=".venv-llamaindex/bin/python",
                        help="the interpreter with LlamaIndex (its OpenAI adapter needs openai below 3)")
    parser.add_argument("--timeout", type=float, default=600, metavar="SECONDS", help="per scenario")
    parser.add_argument("--start-timeout", type=float, default=1800, metavar="SECONDS")
    parser.add_argument("--server-port", type=int, default=None,
                        help="drive an unsee serve already listening on this loopback port instead of starting one")
    parser.add_argument("--table", metavar="RESULTS_JSON", help="print the table of a finished run, run nothing")
    options.add_out(parser, "out/serve-agents", help="a folder: results.json, table.md, exchanges.jsonl, logs")
    args = parser.parse_args(argv)
    check_scenarios(parser, args.scenarios)
    return args


def check_scenarios(parser: argparse.ArgumentParser, scenarios: list[str]) -> None:
    """``--scenarios`` names only scenarios of :data:`SCENARIOS` (else the parser's error, naming them)."""
    names = [s.name for s in SCENARIOS]
    unknown = sorted(set(scenarios) - set(names))
    if unknown:
        parser.error(f"--scenarios: unknown {unknown}; expected some of {names}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.table:
        print(format_table(json.loads(Path(args.table).read_text())), end="")
        return 0
    out = Path(args.out)
    shutil.rmtree(out / "logs", ignore_errors=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    label, started = get_label(args, argv), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="serve-agents-") as tmp:
        records, exchanges = run_scenarios(args, Path(tmp), out)
    label["load_average_end"] = round(os.getloadavg()[0], 1)
    result = {"label": label, "wall_s": round(time.perf_counter() - started, 1), "records": records}
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "exchanges.jsonl").write_text("".join(json.dumps(e, default=str) + "\n" for e in exchanges))
    table = format_table(result)
    (out / "table.md").write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
