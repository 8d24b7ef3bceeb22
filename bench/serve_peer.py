"""``unsee serve`` against llama-cpp-python's own OpenAI server and llama.cpp's own
``llama-server`` on the same GGUF and threads (issue 40, item 1; issue 50, item 4;
docs/serve.md, "Against llama_cpp.server" and "Against llama-server").

    make serve-peer                    # from a fresh clone: both venvs, llama-server, then this bench
    python -m unsee.bench.serve_peer --peer-python .venv-peer/bin/python \\
        --llama-server out/llama-server/build/bin/llama-server \\
        [--model qwen2.5-1.5b] [--threads 1 | --defaults] [--concurrency 1,4,8] [--turns 3] [--max-tokens 32]

``llama-server`` (``make llama-server`` builds it from the llama.cpp source llama-cpp-python
vendors) runs with ``--parallel`` slots (default 8, each of ``--n-ctx`` cells), flash
attention on and ``-t``/``-tb`` at the same threads. ``--defaults``: every server with its
own thread defaults instead (no thread option, no ``UNSEE_LLAMA_THREADS``): what a user
who starts each as its README says gets.

Both servers run as the user would start them, each in a process of its own
on loopback (a fresh one per system, unsee's two included, so no system's
conversations hold slots another's phases need): ``python -m llama_cpp.server`` (its ``server`` extra, in the
bench's own venv, ``.venv-peer``) over the catalogue's file of ``--model``
with ``--n_threads`` at ``--threads`` and ``--n_threads_batch`` at
``--batch-threads`` (default ``--threads``), flash
attention on (as unsee runs it), the GGUF's own chat template, logits of
the last token only (``logits_all`` off: its default computes and copies every
prompt token's, which a chat client never reads), and ``interrupt_requests``
off (its default cuts a streaming answer short as soon as another request
waits); and ``unsee serve --engine llamacpp`` with
``UNSEE_LLAMA_THREADS`` and ``UNSEE_LLAMA_BATCH_THREADS`` at the same. Every request is made with the
``openai`` client, streamed, greedy, and capped at ``--max-tokens`` output
tokens. Three ways of holding a conversation, each one the same workload:

    peer        llama_cpp.server's chat completions, the history resent every turn
    unsee-chat  unsee serve's chat completions, the history resent (its exact prefix cache serves it)
    unsee       unsee serve's Responses API on a conversation: the server keeps the conversation's KV

Phases (:mod:`unsee.bench.serve_peer_table` turns the records into the tables):

    load      for each --concurrency level N: N conversations of --turns turns at once, a client
              thread each; per turn its latency and time to the first streamed text (TTFT); the
              aggregate output tokens/s (output tokens counted by re-tokenising each answer with
              the GGUF's own vocabulary, the same count for both servers); where the server has
              ``/metrics`` (unsee, llama-server), its forwards over the level and the
              conversations each one carried
    history   a conversation whose first message holds --history-tokens tokens, then a follow-up
              turn right after it ("warm": the peer still holds that prompt) and another after a
              turn of another conversation ("after another")
    delete    unsee: a conversation whose first turn holds an item, of --turns turns; the item's
              DELETE (the exact forget) and its compute floor (bench/floor.py, timed in this
              process after the servers stop, on the same engine settings, from a copy of the
              conversation's store taken before the DELETE); and a turn of another conversation
              started while a DELETE runs, against the same turn run alone.
              peer: the same conversation resent without the item, every turn answered anew
              (what an exact forget costs a user of a stateless server)

``--rounds N`` runs the load phase N times with every server started first
(idle but for the one driven), the systems' order reversed every other round:
these machines drift by up to 30% within a run, so each round's ratio is read
within the round, and a level's tokens/s is every round's tokens over every
round's wall.

Figures on a loaded machine are not comparable across runs: compare the
systems of one run (docs/serve.md gives the labelled run).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from unsee.bench import options

SYSTEM = "You are a helpful assistant."
SYSTEMS = ("peer", "llama-server", "unsee-chat", "unsee")
#: the systems that hold no conversation: the client resends the history every turn
RESENDING = ("peer", "llama-server")
TOPICS = ("a bicycle", "a lighthouse", "the moon", "a library", "bread", "a river", "a violin", "a glacier",
          "a compass", "a beehive", "a volcano", "a telescope")
SECRET = ("secret", "My locker code is 4417, keep it in mind.")


def get_turn_text(conversation: int, turn: int, series: str = "") -> str:
    """A turn's question. ``series`` names the conversation's round and level in the load phase, so
    that no conversation repeats one an earlier round or level sent: a server whose cache kept that
    conversation's prompt would skip its prefill (llama-server's slots keep the last prompt each).
    The label opens the question, its round first: a label after common words ("Conversation 0 of
    set 2.8") let llama-server's slots reuse those words of the last round's conversation in the
    same slot, 10 tokens a conversation that no real user's conversations share (at 4a51a42:
    29 tokens prefilled of 49 in rounds 2 and 3, first text at 3.3 s against 5.0 s in round 1)."""
    name = f"{series}/{conversation}" if series else f"{conversation}"
    # an answer longer than --max-tokens, so that every server decodes the cap: exact kernels and
    # llama.cpp's own compute other bits, and a greedy answer that ends early on one server spreads its
    # turn's fixed costs (the prefill, the first token) over fewer tokens (one fact ran 64 tokens in
    # unsee against 96 in llama-server over a round's three turns, at 9f59d7b)
    return (f"[{name}] Question {turn}: describe {TOPICS[(conversation + turn) % len(TOPICS)]} "
            "in detail, in a paragraph of at least a hundred words.")


def get_document(n_tokens: int, count) -> str:
    """A made-up list of notes of at least ``n_tokens`` tokens (``count(text)``: its tokens)."""
    colours = ("red", "green", "blue", "amber", "violet", "grey", "white", "black")
    lines, i = ["Here are my notes on the items in the store room."], 0
    while True:
        i += 1
        lines.append(f"Item {i} is {colours[i * 7 % len(colours)]} and sits on shelf {i * 13 % 29}.")
        if i % 10 == 0 and count(" ".join(lines)) >= n_tokens:
            return " ".join(lines)


# ------------------------------------------------------------------ servers


def get_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A server process on loopback and its base URL."""

    name: str
    process: subprocess.Popen
    url: str
    log: Path

    def wait_ready(self, timeout: float) -> None:
        """Until ``GET /v1/models`` answers (the model is loaded), or fail naming the log."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s; see {self.log}")

    def get_engine_figures(self) -> dict | None:
        """The server's forwards so far from its ``/metrics`` (None where it has none):
        ``forwards``, ``rows`` (the conversations' rows summed over them: a forward batching 8
        conversations' next tokens counts 8) and, for unsee, ``busy_s`` (its loop's computing)."""
        import urllib.request

        try:
            with urllib.request.urlopen(self.url.removesuffix("/v1") + "/metrics", timeout=30) as reply:
                text = reply.read().decode()
        except OSError:
            return None
        return parse_engine_figures(text)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_peer(python: str, gguf: Path, name: str, threads: int | None, batch_threads: int | None, n_ctx: int,
               logs: Path) -> Server:
    """llama_cpp.server; ``threads`` None: its own thread defaults."""
    port = get_free_port()
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", name,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--flash_attn", "true",
               "--logits_all", "false", "--interrupt_requests", "false", "--verbose", "false"]
    if threads is not None:
        command += ["--n_threads", str(threads), "--n_threads_batch", str(batch_threads)]
    log = logs / "peer.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return Server("llama_cpp.server", process, f"http://127.0.0.1:{port}/v1", log)


def get_unsee_threads(log: Path) -> dict:
    """The threads ``unsee serve`` said it runs on (its start line: ``llama.cpp decodes on N
    thread(s) and prefills on M``), as label fields; none where its log does not say."""
    match = re.search(r"decodes on (\d+) thread\(s\) and prefills on (\d+)", log.read_text()) if log.exists() else None
    return {"unsee_threads": int(match[1]), "unsee_batch_threads": int(match[2])} if match else {}


def parse_engine_figures(text: str) -> dict | None:
    """Forwards from a ``/metrics`` page: unsee's ``unsee_engine_forwards_total{steps}`` and
    ``unsee_engine_busy_seconds_total``, or llama-server's ``llamacpp:n_decode_total`` and
    ``llamacpp:n_busy_slots_per_decode`` (an average since its start: times the decodes, the
    rows); None where neither is there."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    ours = {k: v for k, v in samples.items() if k.startswith("unsee_engine_forwards_total{")}
    if ours:
        steps = {int(k.split('"')[1]): v for k, v in ours.items()}
        return {"forwards": sum(steps.values()), "rows": sum(n * c for n, c in steps.items()),
                "busy_s": samples.get("unsee_engine_busy_seconds_total")}
    if "llamacpp:n_decode_total" in samples:
        decodes = samples["llamacpp:n_decode_total"]
        return {"forwards": decodes, "rows": decodes * samples.get("llamacpp:n_busy_slots_per_decode", 0.0),
                "busy_s": None}
    return None


def get_engine_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the server's engine did between two readings (:meth:`Server.get_engine_figures`)."""
    if before is None or after is None:
        return None
    return {k: None if before[k] is None or after[k] is None else after[k] - before[k] for k in before}


def start_llama_server(binary: str, gguf: Path, name: str, threads: int | None, batch_threads: int | None,
                       n_ctx: int, parallel: int, logs: Path) -> Server:
    """llama.cpp's ``llama-server``, ``parallel`` slots of ``n_ctx`` cells each; ``threads``
    None: its own thread defaults."""
    if not Path(binary).is_file():
        raise FileNotFoundError(f"--llama-server {binary}: no such file (`make llama-server` builds it)")
    port = get_free_port()
    command = [binary, "--model", str(gguf), "--alias", name, "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(n_ctx * parallel), "--parallel", str(parallel), "--flash-attn", "on",
               "--metrics"]  # its decodes and busy slots per decode, read around each level
    if threads is not None:
        command += ["--threads", str(threads), "--threads-batch", str(batch_threads)]
    log = logs / "llama-server.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    return Server("llama-server", process, f"http://127.0.0.1:{port}/v1", log)


def start_unsee(model: str, threads: int | None, batch_threads: int | None, max_tokens: int, store: Path,
                logs: Path, log_name: str = "unsee.log") -> Server:
    """unsee serve; ``threads`` None: its own thread defaults."""
    port = get_free_port()
    command = [sys.executable, "-m", "unsee.impl.cli", "serve", "--engine", "llamacpp", "--model", model,
               "--store", str(store), "--port", str(port), "--max-output-tokens", str(max_tokens),
               "--busy-wait", "3600"]
    env = {k: v for k, v in os.environ.items() if k not in ("UNSEE_LLAMA_THREADS", "UNSEE_LLAMA_BATCH_THREADS")}
    if threads is not None:
        env |= {"UNSEE_LLAMA_THREADS": str(threads), "UNSEE_LLAMA_BATCH_THREADS": str(batch_threads)}
    log = logs / log_name
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Server("unsee serve", process, f"http://127.0.0.1:{port}/v1", log)


# ------------------------------------------------------------------ clients


@dataclass
class Turn:
    """One answered turn, as the client saw it."""

    text: str
    latency_s: float
    ttft_s: float  # to the first non-empty streamed text; the latency where none came


@dataclass
class ChatConversation:
    """A conversation held by the client: chat completions with the whole history resent."""

    client: object
    model: str
    max_tokens: int
    messages: list = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])

    def turn(self, items: list[tuple[str, str]]) -> Turn:
        self.messages += [{"role": "user", "content": text} for _, text in items]
        started, first, parts = time.perf_counter(), None, []
        stream = self.client.chat.completions.create(model=self.model, messages=self.messages, stream=True,
                                                     max_tokens=self.max_tokens, temperature=0)
        for chunk in stream:
            piece = chunk.choices[0].delta.content if chunk.choices else None
            if piece:
                first = first or time.perf_counter()
                parts.append(piece)
        done = time.perf_counter()
        text = "".join(parts)
        self.messages.append({"role": "assistant", "content": text})
        return Turn(text, done - started, (first or done) - started)


@dataclass
class ServerConversation:
    """A conversation the server keeps (unsee's Responses API with ``conversation``)."""

    client: object
    model: str
    max_tokens: int
    id: str = ""

    def turn(self, items: list[tuple[str, str]]) -> Turn:
        if not self.id:
            self.id = self.client.conversations.create().id
        inputs = [{"type": "message", "role": "user", "content": text, "id": item_id} for item_id, text in items]
        started, first, parts, text = time.perf_counter(), None, [], None
        stream = self.client.responses.create(model=self.model, conversation=self.id, input=inputs, stream=True,
                                              max_output_tokens=self.max_tokens, temperature=0)
        for event in stream:
            if event.type == "response.output_text.delta" and event.delta:
                first = first or time.perf_counter()
                parts.append(event.delta)
            elif event.type in ("response.completed", "response.incomplete"):
                text = event.response.output_text
        done = time.perf_counter()
        return Turn(text if text is not None else "".join(parts), done - started, (first or done) - started)

    def delete(self, item_id: str) -> tuple[float, dict]:
        """The item's DELETE: its latency and the reply's ``report`` (the forget's own account)."""
        started = time.perf_counter()
        reply = self.client.conversations.items.delete(item_id, conversation_id=self.id)
        return time.perf_counter() - started, (reply.model_extra or {}).get("report") or {}


def new_conversation(system: str, client, model: str, max_tokens: int):
    return (ServerConversation if system == "unsee" else ChatConversation)(client, model, max_tokens)


def record(answered: Turn, **where) -> dict:
    return {**where, "latency_s": answered.latency_s, "ttft_s": answered.ttft_s, "text": answered.text}


def get_cpu_seconds(pid: int) -> float | None:
    """A process's CPU seconds so far, user and system (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


@dataclass
class Bench:
    """What each phase needs: the client, the model's name, the options, and the
    server's process (its CPU time is what a loaded machine does not inflate)."""

    client: object
    model: str
    args: argparse.Namespace
    pid: int
    server: Server | None = None
    engine: object = None  # the bench's own engine, which times a DELETE's floor (unsee only)

    def new(self, system: str):
        return new_conversation(system, self.client, self.model, self.args.max_tokens)

    def measured(self, request, **where) -> dict:
        """``request()`` (a turn) alone on the server: its record with the server's CPU seconds."""
        before = get_cpu_seconds(self.pid)
        row = record(request(), **where)
        after = get_cpu_seconds(self.pid)
        return {**row, "server_cpu_s": None if before is None or after is None else after - before}


# ------------------------------------------------------------------- phases


def run_level(b: Bench, system: str, level: int, round_: int = 0) -> list[dict]:
    """``level`` conversations of ``--turns`` turns at once, a client thread
    each; every turn's record, with the level's wall time and the server's
    CPU seconds over it. A failed turn fails the run."""
    convs = [b.new(system) for _ in range(level)]

    def drive(j: int) -> list[dict]:
        rows = []
        for i in range(1, b.args.turns + 1):
            text = get_turn_text(j, i, f"{round_ + 1}.{level}")  # every round and level its own conversations
            rows.append(record(convs[j].turn([(f"c{j}t{i}", text)]), phase="load", level=level, question=text,
                               conversation=j, turn=i))
        return rows

    engine = b.server.get_engine_figures() if b.server else None
    started, cpu = time.perf_counter(), get_cpu_seconds(b.pid)
    with concurrent.futures.ThreadPoolExecutor(level) as workers:
        futures = [workers.submit(drive, j) for j in range(level)]
        out = [r for f in futures for r in f.result()]
    wall, cpu_after = time.perf_counter() - started, get_cpu_seconds(b.pid)
    engine = get_engine_delta(engine, b.server.get_engine_figures() if b.server else None)
    return [{**r, "level_wall_s": wall, "level_cpu_s": None if cpu is None else cpu_after - cpu,
             "level_engine": engine} for r in out]


def run_history(b: Bench, system: str, document: str) -> list[dict]:
    """A first turn over the document, a follow-up right after, a turn of another
    conversation, then another follow-up."""
    conv, other = b.new(system), b.new(system)
    turns = [(conv, "doc", document + " Summarise these notes in one sentence.", "first"),
             (conv, "q17", "What colour is item 17?", "warm"), (other, "o1", get_turn_text(99, 1), "other"),
             (conv, "q42", "What colour is item 42?", "after another")]
    return [b.measured(lambda c=c, i=i, t=t: c.turn([(i, t)]), phase="history", step=step) for c, i, t, step in turns]


def get_delete_turns(turns: int) -> list[list[tuple[str, str]]]:
    return [[SECRET, ("d1", get_turn_text(50, 1))]] + [[(f"d{i}", get_turn_text(50, i))] for i in range(2, turns + 1)]


def run_delete_unsee(b: Bench, store: Path, keep: Path) -> list[dict]:
    """--delete-rounds rounds of: the DELETE alone, its compute floor timed right after it (its
    store copied first), then a DELETE on a second copy of the conversation with another
    conversation's turn started during it, and that turn alone before. Each round's ratios are
    read within the round, a drifting machine weighing on both sides alike."""
    rows = []
    for round_ in range(b.args.delete_rounds):
        rows += [{**r, "round": round_} for r in run_delete_round(b, store, keep / f"round-{round_}")]
    return rows


def run_delete_round(b: Bench, store: Path, keep: Path) -> list[dict]:
    convs = [b.new("unsee") for _ in range(2)]
    for conv in convs:
        for items in get_delete_turns(b.args.turns):
            conv.turn(items)
    shutil.copytree(store / convs[0].id, keep / convs[0].id)
    cpu = get_cpu_seconds(b.pid)
    seconds, report = convs[0].delete(SECRET[0])
    cpu = None if cpu is None else get_cpu_seconds(b.pid) - cpu
    digest = b.client.conversations.retrieve(convs[0].id).model_extra["unsee"]["digest"]
    rows = [{"phase": "delete", "step": "delete", "latency_s": seconds, "server_cpu_s": cpu,
             "report_wall_s": report.get("wall_s"), "conversation": convs[0].id, "digest": digest,
             **{k: report.get(k) for k in ("prefilled_tokens", "decoded_tokens", "forward_calls")},
             "floor": measure_floor(b.engine, keep / convs[0].id / "session.db", digest)}]
    other = b.new("unsee")
    other.turn([("b1", get_turn_text(60, 1))])
    rows.append(b.measured(lambda: other.turn([("b2", get_turn_text(60, 2))]), phase="delete", step="other alone"))
    result = {}
    deleting = threading.Thread(target=lambda: result.update(seconds=convs[1].delete(SECRET[0])[0]))
    deleting.start()
    time.sleep(b.args.during * seconds)  # into the second DELETE, timed by the first
    during = other.turn([("b3", get_turn_text(60, 3))])
    deleting.join()
    rows.append(record(during, phase="delete", step="other during delete", delete_s=result.get("seconds"),
                       started_after_s=b.args.during * seconds))
    return rows


def run_delete_peer(b: Bench) -> list[dict]:
    """The conversation, then all of it again without the item, every answer anew."""
    conv = b.new("peer")
    for items in get_delete_turns(b.args.turns):
        conv.turn(items)
    again, cpu = b.new("peer"), get_cpu_seconds(b.pid)
    turns = [again.turn([i for i in items if i != SECRET]) for items in get_delete_turns(b.args.turns)]
    return [{"phase": "delete", "step": "resend without the item", "latency_s": sum(t.latency_s for t in turns),
             "server_cpu_s": None if cpu is None else get_cpu_seconds(b.pid) - cpu, "turns": len(turns),
             "texts": [t.text for t in turns]}]


def open_bench(system: str, server: Server, args: argparse.Namespace, engine) -> Bench:
    """The phases' client on ``server``, after a warm-up turn (the first request's one-time costs)."""
    import openai

    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=3600)
    b = Bench(client, args.model, args, server.process.pid, server, engine)
    b.new(system).turn([("w", "Hello.")])
    return b


def run_load(b: Bench, system: str, args: argparse.Namespace, round_: int = 0) -> list[dict]:
    """The load phase: each --concurrency level in turn (round ``round_`` of --rounds)."""
    rows = []
    for level in args.concurrency:
        where = f", round {round_ + 1} of {args.rounds}" if args.rounds > 1 else ""
        say_phase(system, f"load, {level} conversation(s){where}")
        rows += [{**r, "round": round_} for r in run_level(b, system, level, round_)]
    return rows


def run_after_load(b: Bench, system: str, args: argparse.Namespace, document: str, store: Path | None,
                   keep: Path) -> list[dict]:
    """The phases after the load: the history, then the DELETE (or the peer's resend)."""
    rows = []
    if "history" in args.phases:
        say_phase(system, f"history ({args.history_tokens} tokens)")
        rows += run_history(b, system, document)
    if "delete" in args.phases and system in ("unsee", *RESENDING):
        say_phase(system, "delete")
        rows += run_delete_unsee(b, store, keep) if system == "unsee" else run_delete_peer(b)
    return rows


def run_system(system: str, server: Server, args: argparse.Namespace, document: str,
               store: Path | None, keep: Path, engine) -> list[dict]:
    b = open_bench(system, server, args, engine)
    rows = (run_load(b, system, args) if "load" in args.phases else []) + \
        run_after_load(b, system, args, document, store, keep)
    return [{**r, "system": system} for r in rows]


def say_phase(system: str, phase: str) -> None:
    """A progress line on stderr (a run takes about half an hour): the system and the phase it starts."""
    print(f"serve_peer: {time.strftime('%H:%M:%S')} {LABELS_SHORT.get(system, system)}: {phase}",
          file=sys.stderr, flush=True)


#: the systems as a progress line names them
LABELS_SHORT = {"peer": "llama_cpp.server", "llama-server": "llama-server", "unsee-chat": "unsee chat",
                "unsee": "unsee responses"}


# -------------------------------------------------------------- the floor


def measure_floor(engine, db: Path, digest: str) -> dict:
    """The compute floor of a DELETE (bench/floor.py) from the copy of its conversation's store
    (``db``) taken before it, and whether the full reset reaches ``digest``, the one the server
    reported after the DELETE. Timed in this process, on its engine, while the server idles."""
    from unsee import PersistentSession
    from unsee.bench.floor import compute_floor
    from unsee.impl.methods.baselines import apply_method

    before = set(engine.budget.lineages)
    session = PersistentSession.open(db, engine)
    try:
        base = session.runtime
        boundary = base.checkpoints.latest_before(base.graph.first_entry(SECRET[0])).boundary
        reset, _ = apply_method(base, "reset", SECRET[0])
        floor = compute_floor(engine, base, reset, boundary).to_json()
        floor["reset_digest_equal"] = reset.digest() == digest
    finally:
        session.close()
        for lineage in set(engine.budget.lineages) - before:  # the next round's floor starts as this one did
            engine.drop(lineage)
    return floor


# --------------------------------------------------------------------- main


def get_label(args: argparse.Namespace, argv: list[str]) -> dict:
    """Build, CPU, threads, command, load: what a figure needs to be read."""
    from unsee.bench.llamacpp_exact_batch import get_cpu_name

    try:
        build = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        build = "not recorded"
    return {"build": build, "cpu": get_cpu_name(), "cores": os.cpu_count(),
            "threads": None if args.defaults else args.threads,
            "batch_threads": None if args.defaults else args.batch_threads, "parallel": args.parallel,
            "model": args.model, "rounds": args.rounds,
            "command": "python -m unsee.bench.serve_peer " + " ".join(argv),
            "load_average": os.getloadavg()[0]}


def get_starters(args: argparse.Namespace, engine, work: Path) -> dict:
    """``{system: (start, store)}`` for each asked-for system, peers first: ``start()`` a fresh
    server of it, ``store`` the folder unsee's conversations are kept in (None for a peer)."""
    gguf = Path(engine.lm.source)  # the file the engine loaded: the catalogue's, a built-in one or a path
    threads, batch = (None, None) if args.defaults else (args.threads, args.batch_threads)
    starters = {"peer": (lambda: start_peer(args.peer_python, gguf, args.model, threads, batch, args.n_ctx, work),
                         None),
                "llama-server": (lambda: start_llama_server(args.llama_server, gguf, args.model, threads, batch,
                                                            args.n_ctx, args.parallel, work), None)}
    for system in ("unsee-chat", "unsee"):
        store = work / f"store-{system}"
        starters[system] = (lambda s=system, st=store: start_unsee(args.model, threads, batch, args.max_tokens, st,
                                                                     work, f"{s}.log"), store)
    return {s: starters[s] for s in (*RESENDING, "unsee-chat", "unsee") if s in args.systems}


def run_servers(args: argparse.Namespace, engine, work: Path) -> list[dict]:
    """Each asked-for server in turn (never two driven at once: they would share the cores), its
    systems' phases; the rows. Each unsee system on a server of its own, as each peer is: a system
    starts where the others start, with no conversation of another system's phases holding the
    engine's slots. With --rounds, :func:`run_rounds`."""
    document = get_document(args.history_tokens, lambda text: len(engine.lm.encode(text)))
    keep = work / "before-delete"
    keep.mkdir()
    starters = get_starters(args, engine, work)
    if args.rounds > 1:
        return run_rounds(args, starters, document, keep, engine)
    rows = []
    for system, (start, store) in starters.items():
        server = start()
        try:
            server.wait_ready(args.start_timeout)
            rows += run_system(system, server, args, document, store, keep, engine)
        finally:
            server.stop()
    return rows


def run_rounds(args: argparse.Namespace, starters: dict, document: str, keep: Path, engine) -> list[dict]:
    """Every server started first and kept, idle but for the one driven; the load phase --rounds
    times, the systems' order reversed every other round, so that a machine drifting within the
    run (up to 30% on these machines) weighs on every system alike and each round's ratio is read
    within the round; then each system's other phases in turn."""
    servers: dict[str, Server] = {}
    rows: list[dict] = []
    try:
        for system, (start, _) in starters.items():
            servers[system] = start()
        benches = {}
        for system, server in servers.items():
            server.wait_ready(args.start_timeout)
            benches[system] = open_bench(system, server, args, engine)
        order = list(servers)
        for round_ in range(args.rounds if "load" in args.phases else 0):
            for system in order if round_ % 2 == 0 else order[::-1]:
                rows += [{**r, "system": system} for r in run_load(benches[system], system, args, round_)]
        for system in order:
            rows += [{**r, "system": system}
                     for r in run_after_load(benches[system], system, args, document, starters[system][1], keep)]
    finally:
        for server in servers.values():
            server.stop()
    return rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.get_parser("serve_peer", __doc__)
    options.add_model(parser)  # its GGUF serves both servers: the measurements' own is qwen2.5-1.5b
    parser.add_argument("--peer-python", default=".venv-peer/bin/python",
                        help="the interpreter with llama-cpp-python[server] (make serve-peer builds it)")
    parser.add_argument("--llama-server", default="out/llama-server/build/bin/llama-server",
                        help="llama.cpp's server binary (make llama-server builds it)")
    parser.add_argument("--parallel", type=int, default=8, help="llama-server's slots (--parallel)")
    parser.add_argument("--threads", type=int, default=1, help="threads of every server")
    parser.add_argument("--defaults", action="store_true",
                        help="every server with its own thread defaults (--threads and --batch-threads unused)")
    parser.add_argument("--batch-threads", type=int, default=None,
                        help="threads of both servers' forwards of several tokens (prefill; llama.cpp's "
                             "n_threads_batch, unsee's UNSEE_LLAMA_BATCH_THREADS); default --threads")
    parser.add_argument("--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 4, 8])
    options.add_rounds(parser, help="the load phase this many times, every server started first and the "
                                    "systems' order reversed every other round (a drifting machine weighs on "
                                    "each alike; each round's ratio is reported); 1: each server in turn")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per answer at most")
    parser.add_argument("--history-tokens", type=int, default=1000, help="the history phase's first message")
    parser.add_argument("--n-ctx", type=int, default=4096, help="the peer's context (unsee's lineages: 4096)")
    parser.add_argument("--systems", type=lambda t: t.split(","), default=list(SYSTEMS),
                        help=f"of {', '.join(SYSTEMS)}")
    parser.add_argument("--phases", type=lambda t: t.split(","), default=["load", "history", "delete"])
    parser.add_argument("--delete-rounds", type=int, default=1, metavar="N",
                        help="the delete phase this many times on unsee, each DELETE's floor timed right "
                             "after it; the goals read the median of the rounds' ratios")
    parser.add_argument("--during", type=float, default=0.25, metavar="FRACTION",
                        help="the other conversation's turn starts this fraction of the first DELETE's "
                             "latency after the second DELETE")
    parser.add_argument("--start-timeout", type=float, default=1800, metavar="SECONDS")
    options.add_out(parser, "out/serve-peer", help="a folder: serve-peer.json, serve-peer.md, logs")
    parser.add_argument("--docs", metavar="PAGE", help="also write the table and its goals into PAGE's generated "
                        "region (docs/serve.md; bench/serve_peer_table.py's REGIONS), the summary beside it")
    args = parser.parse_args(argv)
    args.batch_threads = args.batch_threads or args.threads
    if args.rounds < 1 or args.delete_rounds < 1:
        parser.error(f"--rounds {args.rounds}, --delete-rounds {args.delete_rounds}: expected 1 or more each")
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems: unknown {unknown}; expected some of {list(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    from unsee.bench.serve_peer_table import format_markdown, summarise, write_docs
    from unsee.impl.engines.registry import load_engine

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    label = get_label(args, argv)
    # loaded here first: the decode facts of these settings are measured (once) before any server times
    # (a run without unsee uses it for the tokens only: one thread, whose facts are measured soonest)
    threads = ({"threads": 1} if not {"unsee", "unsee-chat"} & set(args.systems) else {}) if args.defaults else \
        {"threads": args.threads, "batch_threads": args.batch_threads}
    engine = load_engine(args.model, "llamacpp", **threads)
    label["gguf"] = Path(engine.lm.source).name
    with tempfile.TemporaryDirectory(prefix="serve-peer-") as tmp:
        work = Path(tmp)
        rows = run_servers(args, engine, work)
        for r in rows:
            for text in [r["text"]] if "text" in r else r.get("texts", []):
                r["output_tokens"] = r.get("output_tokens", 0) + len(engine.lm.encode(text))
        floor = next((r["floor"] for r in rows if r.get("step") == "delete"), None)
        label |= get_unsee_threads(work / "unsee.log")
        for log in ("peer.log", "llama-server.log", "unsee-chat.log", "unsee.log"):
            if (work / log).exists():
                shutil.copy(work / log, out / log)
    label["load_average_end"] = os.getloadavg()[0]
    result = {"label": label, "summary": summarise(rows, floor, args), "floor": floor, "rows": rows}
    (out / "serve-peer.json").write_text(json.dumps(result, indent=1))
    markdown = format_markdown(result)
    (out / "serve-peer.md").write_text(markdown)
    if args.docs:
        write_docs("goals", [result], Path(args.docs))
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
