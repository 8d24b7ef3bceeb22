"""A conversation's turns (docs/serve.md, "Items and steps", "Tools", "Forget with client-side tools"):

- :func:`respond`: a response's step under its config (instructions, tools,
  tool choice): the outputs of the last turn's calls first, bound to the
  calls they answer, then the other items in order, each in its role; every
  check runs before the first write;
- :func:`forget`: the exact forget of an item (Algorithm 1 with the client
  tools' replay, :class:`~unsee.impl.agent.tools.client.ClientToolRuntime`);
  where the replay stopped at a call no recorded output answers, the
  recorded inputs it did not replay are *held* in the sidecar: the outputs
  it matched for that call's turn and the other items of that turn's tool
  step (which follow the client's outputs), then the rest step by step;
- :func:`resume`: after the client's outputs for that call, the held inputs
  replayed as the client would send them, until the next such call.

Each function runs with the conversation's lock and the engine's held (:meth:`~unsee.impl.serve.pool.Pool.hold`).
"""

from __future__ import annotations

from unsee import Item, PersistentSession, Settings, Step
from unsee.impl.agent.tools.client import (
    ClientToolRuntime,
    Config,
    Sampling,
    get_context_length,
    get_signatures,
    get_step_id,
    prepare_step,
)
from unsee.impl.agent.tools.native import THINK
from unsee.impl.agent.tools.observed import Role, compute_roles
from unsee.impl.serve import shapes
from unsee.impl.serve.compaction import compact, get_limit, is_compaction_due
from unsee.impl.serve.conversation import (
    Conversation,
    get_answer_items,
    get_call_ids,
    get_item_role,
    get_waiting_items,
)
from unsee.impl.serve.errors import ApiError, bad_request, not_found

DEFAULT_SAMPLING = Sampling()


def check_length(engine, runtime, step: Step, config: Config, settings: Settings, explicit: bool = True,
                 roles: dict[str, Role] | None = None) -> None:
    """A turn that would pass the model's context: a 400 with code ``context_length_exceeded``,
    before anything is written. The prompt must leave room for an output token, and for all of
    the output cap where the request named it (``explicit``); a default cap is cut to what the
    context has left (:meth:`~unsee.impl.agent.tools.client.ClientToolRuntime.get_turn_settings`)."""
    limit = get_context_length(engine.lm)
    if limit is None or (runtime is not None and not isinstance(runtime, ClientToolRuntime)):
        return
    probe = runtime or ClientToolRuntime(engine, config.system, settings, config=config)
    prompt = probe.get_turn_length(step, config, roles)
    if explicit and prompt + settings.max_new_tokens > limit:
        raise bad_request(f"input: this turn needs {prompt} tokens of context and up to {settings.max_new_tokens} "
                          f"of output, {prompt + settings.max_new_tokens} in all; the model's context holds "
                          f"{limit}", param="input", code="context_length_exceeded")
    if prompt >= limit:
        raise bad_request(f"input: this turn needs {prompt} tokens of context before its output; the model's "
                          f"context holds {limit}", param="input", code="context_length_exceeded")


def get_config(conv: Conversation, req: dict, sampling: Sampling = DEFAULT_SAMPLING) -> Config:
    """A response's config: its instructions (else the conversation's system prompt), tools and
    decoding settings."""
    system = req["instructions"] if req["instructions"] is not None else conv.record["system"]
    return Config(system, req["tools"], req["choice"], req["function"], req["parallel"], req.get("format"), sampling)


def get_sampling(req: dict, session: Settings, defaults: Settings) -> Sampling:
    """The request's decoding settings as its turn records them: each value the request gives,
    else the server's default (``defaults``); temperature, seed and cap left out where they are
    the session's own (a conversation's session settings are the server's defaults when it was
    created), seed and nucleus where the turn is greedy (they change nothing there). So a turn's
    record depends on how it is decoded, not on how the request spelled it."""
    temperature = req["temperature"] if req["temperature"] is not None else defaults.temperature
    seed = req["seed"] if req["seed"] is not None else defaults.seed
    cap = req["max_new_tokens"] or defaults.max_new_tokens
    greedy = temperature == 0
    return Sampling(temperature=None if temperature == session.temperature else temperature,
                    seed=None if greedy or seed == session.seed else seed,
                    max_new_tokens=None if cap == session.max_new_tokens else cap,
                    top_p=1.0 if greedy else req["top_p"], frequency_penalty=req.get("frequency_penalty", 0.0),
                    presence_penalty=req.get("presence_penalty", 0.0), stop=req["stop"])


def bind_outputs(conv: Conversation, todo: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The step's items and which call each output answers: where the last turn made calls, the
    step opens with their outputs, one for each call no held output answers (the OpenAI API's
    rule), in the calls' order, held outputs among them; then the other items a forget held
    for that step (``held_extra``), then the other items in the order they came. Without
    calls, every item comes as it came (an output bound to no call)."""
    pending = conv.get_pending_calls()
    held = [{"kind": "function_call_output", "role": "tool", "id": o["id"], "text": o["text"],
             "call_id": o["call_id"], "name": o["name"]} for o in conv.record["held_outputs"]]
    if not pending and not held:
        return conv.record["held_extra"] + todo, {}
    waiting = [c["call_id"] for c in pending]
    runtime = conv.runtime
    ids = get_call_ids(runtime, runtime.steps[-1].id)
    bound = {o["id"]: o["call_index"] for o in conv.record["held_outputs"]}
    n = 0  # the outputs that open the step: those naming a waiting call
    while n < len(todo) and todo[n]["kind"] == "function_call_output" and todo[n]["call_id"] in waiting:
        if ids.index(todo[n]["call_id"]) in bound.values():
            raise bad_request(f"input: call_id {todo[n]['call_id']!r} is answered twice", param="input")
        bound[todo[n]["id"]] = ids.index(todo[n]["call_id"])
        n += 1
    missing = [c for c in waiting if ids.index(c) not in bound.values()]
    if missing:
        raise bad_request(f"input: the conversation ends in calls {missing} that no output answers: send their "
                          "function_call_output items first, before any other item", param="input",
                          code="pending_tool_calls")
    late = [i["call_id"] for i in todo[n:] if i["kind"] == "function_call_output" and i["call_id"] in waiting]
    if late:
        raise bad_request(f"input: call_id {late[0]!r} is answered twice", param="input")
    return sorted(held + todo[:n], key=lambda i: bound[i["id"]]) + conv.record["held_extra"] + todo[n:], bound


def get_roles(items: list[dict]) -> dict[str, Role]:
    """Each item's role, as a step records it (a call's and an output's with the tool's name)."""
    return {i["id"]: (get_item_role(i), i["name"]) if i["kind"] != "message" else (i["role"],) for i in items}


def get_step(conv: Conversation, items: list[dict], bound: dict[str, int]) -> tuple[Step, dict[str, Role]]:
    """The next step and the roles it records: a ``tool`` step where it answers the last turn's
    calls (``bound``), else a ``user`` step; its items of other roles than its kind's (assistant
    messages, a client's calls, outputs that answer no call of the model's, system messages)
    recorded with their roles. The kind depends on the calls alone, never on which items
    came, so a step without one of them is the step a twin never given it runs."""
    step_id = get_step_id(conv.runtime.t if conv.runtime is not None else 0)
    observed = tuple(Item(i["id"], i["text"]) for i in items)
    if bound:
        step = Step(step_id, "tool", observed, ",".join(sorted({i["name"] for i in items if i["id"] in bound})))
    else:
        step = Step(step_id, "user", observed)
    return step, compute_roles(step, get_roles(items))


def run_step(conv: Conversation, engine, step: Step, config: Config, bound: dict, session: Settings,
             listener=None, logprobs: int | None = None, roles: dict[str, Role] | None = None,
             cache=None) -> list[dict]:
    """Observe ``step`` under ``config`` (its items in ``roles``) and decode the answer, committed;
    the answer's items (with its tokens' log-probabilities where ``logprobs`` asks,
    :func:`add_logprobs`). The first step creates the store, its session settings ``session``
    (a failed one leaves none), its system block served from the owner's ``cache``
    (:meth:`~unsee.impl.serve.chat.ChatCache.start`) where one is given."""
    first = conv.session is None
    if first:
        runtime = (cache.start(conv.id, config.system, session, config) if cache is not None
                   else ClientToolRuntime.start(engine, config.system, session, config=config))
        conv.session = PersistentSession.create(conv.store_path, runtime)
    runtime = conv.runtime
    runtime.client.expect(config, bound, roles)
    if listener is not None:
        listener.prepare(runtime.get_opening(config), runtime.get_openings(config))
        listener.stops = config.sampling.stop
        listener.thinking = runtime.renderer.render_header().rstrip().endswith(THINK)
        runtime.listener = listener
    runtime.logprobs = logprobs
    try:
        conv.session.step(step)
    except BaseException:
        if first:
            conv.evict()
            conv.store_path.unlink(missing_ok=True)
        raise
    finally:
        runtime.listener, runtime.logprobs = None, None
    items = add_reasoning(conv.runtime, step.id, get_answer_items(conv.runtime, step.id))
    if logprobs is not None:
        items = add_logprobs(engine.lm, items, runtime.decisions)
    if listener is not None:
        listener.answer(items)
    return items


def add_reasoning(runtime, step_id: str, items: list[dict]) -> list[dict]:
    """``items`` opened by a reasoning item where the answer opened with a ``<think>`` block (its id
    the answer message's or first call's, ``rs_`` for its prefix)."""
    text = runtime.get_reasoning(step_id)
    if not text or not items:
        return items
    return [shapes.reasoning("rs_" + items[0]["id"].split("_", 1)[-1], text), *items]


def add_logprobs(lm, items: list[dict], decisions: dict) -> list[dict]:
    """``items`` with the answer message's tokens' log-probabilities (:func:`get_logprobs`)."""
    out = []
    for item in items:
        if item["type"] == "message":
            part = item["content"][0]
            item = {**item, "content": [{**part, "logprobs": get_logprobs(lm, decisions, part["text"])}]}
        out.append(item)
    return out


def get_logprobs(lm, decisions: dict, text: str) -> list[dict]:
    """The log-probability of each token of an answer's ``text`` (OpenAI's shape: the token, its
    log-probability, its UTF-8 bytes, the alternatives asked for), from the turn's decisions
    (:func:`~unsee.impl.agent.tools.client.collect_decision`): the tokens up to the one that
    completes the text (a stop text, the end of turn and a call after it are not the text's)."""
    def entry(token: int, logprob: float) -> dict:
        piece = lm.decode([token])
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}

    eos, out, said = set(lm.eos_ids), [], ""
    for position in sorted(decisions):
        token, logprob, top = decisions[position]
        if token in eos or len(said.lstrip()) >= len(text):  # the answer's text is stripped
            break
        out.append({**entry(token, logprob), "top_logprobs": [entry(t, v) for t, v in top]})
        said += out[-1]["token"]
    return out


def get_tool_records(items: list[dict]) -> dict:
    """The sidecar's record of tool outputs and of a client's calls: the client's call id and
    tool name, by item id."""
    return {i["id"]: {"call_id": i["call_id"], "name": i["name"]} for i in items
            if i.get("kind", "function_call_output") in ("function_call_output", "function_call") and i.get("call_id")}


def respond(conv: Conversation, engine, req: dict, defaults: Settings, response_id: str,
            listener=None, cache=None) -> tuple[list[dict], Settings]:
    """One response: the waiting items and the request's input observed as one step, the answer
    decoded and committed (then, where a forget held recorded inputs, their replay resumed); the
    output items and the settings the conversation runs with. ``cache``: the owner's, which a
    first step's system block is served from (:func:`run_step`)."""
    session = conv.runtime.settings if conv.runtime is not None else defaults
    sampling = get_sampling(req, session, defaults)
    settings = sampling.get_settings(session)
    if conv.runtime is not None and not isinstance(conv.runtime, ClientToolRuntime) and (
            req["tools"] or req["instructions"] is not None):
        raise bad_request("tools and instructions: this conversation was stored before the server served them; "
                          "start a new one", param="tools")
    items = conv.assign_ids(conv.record, req["items"], conv.get_used_ids(), conv.get_next_turn())
    config = get_config(conv, req, sampling)
    todo, bound = bind_outputs(conv, conv.record["pending"] + items)  # refuses before anything is written
    step, roles = get_step(conv, todo, bound)
    explicit, compacted = req["max_new_tokens"] is not None, []
    if is_compaction_due(conv, step, config, roles, get_limit(engine, req, settings)):
        # a turn no summary can make room for is refused before the summary is written
        check_length(engine, None, step, config, settings, explicit=explicit, roles=roles)
        compacted = [compact(conv)]  # the summary first (docs/serve.md, "Long conversations")
        step, roles = get_step(conv, todo, bound)
    check_length(engine, conv.runtime, step, config, settings, explicit=explicit, roles=roles)
    if listener is not None:
        listener.start(settings)
        if compacted:
            listener.emit(("answer", compacted, ""))
    out = compacted + run_step(conv, engine, step, config, bound, session, listener, req.get("logprobs"), roles,
                               cache)
    record = conv.record
    conv.save({**record, "pending": [], "held_outputs": [], "held_extra": [],
               "tools": {**record["tools"], **get_tool_records(todo)},
               "responses": record["responses"] + [{"id": response_id, "step": step.id}]})
    if conv.record["held"] and step.kind == "tool":
        out += resume(conv, engine, listener)
    return out, settings


def resume(conv: Conversation, engine, listener=None) -> list[dict]:
    """Replay the held recorded inputs as the client would send them now (:func:`prepare_step`),
    each under its recorded config (its settings too), until one waits for a call's output (or
    would pass the model's context); the answers' items."""
    out = []
    while conv.record["held"]:
        group, rest = conv.record["held"][0], conv.record["held"][1:]
        step = Step(group["step"], group["kind"], tuple(Item(i["id"], i["text"]) for i in group["items"]),
                    group["tool"])
        signatures = {i["id"]: tuple(i["signature"]) for i in group["items"] if i.get("signature")}
        roles = {i["id"]: tuple(i["role"]) for i in group["items"] if i.get("role")}
        prepared = prepare_step(conv.runtime, step, signatures)
        config = Config.from_record(group["config"])
        if prepared.action == "halt":
            if group["kind"] == "tool":
                conv.save({**conv.record, "held": rest, "held_outputs": get_held_outputs(conv, group, prepared.bound),
                           "held_extra": get_held_extra(group, prepared.bound)})
            break
        if prepared.action == "drop":
            conv.save({**conv.record, "held": rest})
            continue
        session = conv.runtime.settings
        try:
            check_length(engine, conv.runtime, prepared.step, config, config.sampling.get_settings(session),
                         explicit=False, roles=roles)
        except ApiError:
            break  # held until the client makes room (deletes an item)
        out += run_step(conv, engine, prepared.step, config, dict(prepared.bound), session, listener, roles=roles)
        kept = [i for i in group["items"] if i["id"] in {x.source for x in prepared.step.items}]
        conv.save({**conv.record, "held": rest, "tools": {**conv.record["tools"], **get_tool_records(kept)}})
    return out


def get_held_outputs(conv: Conversation, group: dict, bound: dict[str, int]) -> list[dict]:
    """A held tool step's outputs that answer calls of the last turn, kept for the step the
    client's outputs for its other calls complete."""
    ids = get_call_ids(conv.runtime, conv.runtime.steps[-1].id)
    return [{"id": i["id"], "text": i["text"], "call_index": bound[i["id"]], "call_id": ids[bound[i["id"]]],
             "name": i["name"]} for i in group["items"] if i["id"] in bound]


def get_held_extra(group: dict, bound: dict[str, int]) -> list[dict]:
    """A held tool step's items that answer no call of the model's (its messages, a client's
    calls, outputs of those): they follow the outputs the client sends for the calls that wait,
    in their order, as items to observe (an output with a signature answered a call the replay
    does not make, and is dropped)."""
    out = []
    for i in group["items"]:
        if i["id"] in bound or i.get("signature"):
            continue
        role = i.get("role") or ["function_call_output"]
        kind = role[0] if role[0] in ("function_call", "function_call_output") else "message"
        out.append({"kind": kind, "id": i["id"], "role": {"function_call": "assistant",
                                                          "function_call_output": "tool"}.get(kind, role[0]),
                    "text": i["text"], "call_id": i["call_id"], "name": role[1] if role[1:] else i["name"],
                    "arguments": i["text"] if kind == "function_call" else None})
    return out


def get_held(runtime, steps: list[Step], configs: dict, signatures: dict, tools: dict, item_id: str,
             roles: dict[str, Role]) -> list[dict]:
    """The sidecar's groups of recorded inputs a forget's replay did not replay (its ``steps``,
    as the run before the forget recorded them, less the forgotten item; each item with the
    role it was recorded with, where not its step kind's)."""
    groups = []
    for step in steps:
        items = [{"id": i.source, "text": i.text, "call_id": tools.get(i.source, {}).get("call_id"),
                  "name": tools.get(i.source, {}).get("name"), "signature": signatures.get(i.source),
                  "role": list(roles[i.source]) if i.source in roles else None}
                 for i in step.items if i.source != item_id]
        config = configs.get(step.id, runtime.client.initial)
        groups.append({"step": step.id, "kind": step.kind, "tool": step.tool, "config": config.get_record(),
                       "items": items})
    return groups


def forget_waiting(conv: Conversation, item_id: str) -> bool:
    """Remove ``item_id`` if it waits (added, or held by a forget): nothing was derived from it."""
    record = conv.record
    pending = [p for p in record["pending"] if p["id"] != item_id]
    outputs = [o for o in record["held_outputs"] if o["id"] != item_id]
    extra = [e for e in record["held_extra"] if e["id"] != item_id]
    held = [{**g, "items": [i for i in g["items"] if i["id"] != item_id]} for g in record["held"]]
    held = [g for g in held if g["items"]]
    if (pending, outputs, extra, held) == (record["pending"], record["held_outputs"], record["held_extra"],
                                           record["held"]):
        return False
    tools = {k: v for k, v in record["tools"].items() if k != item_id}
    conv.save({**record, "pending": pending, "held_outputs": outputs, "held_extra": extra, "held": held,
               "tools": tools, "retired": record["retired"] + [item_id]})
    return True


def get_earlier_held(conv: Conversation) -> list[dict]:
    """What an earlier forget holds, as groups a later one keeps after its own: the outputs kept
    for the calls that wait (one tool group, each with its call's signature), then the rest."""
    outputs, extra, runtime = conv.record["held_outputs"], conv.record["held_extra"], conv.runtime
    if not outputs and not extra:
        return list(conv.record["held"])
    calls = runtime.get_turn(runtime.steps[-1].id)[1]
    items = [{**{k: o[k] for k in ("id", "text", "call_id", "name")},
              "signature": list(calls[o["call_index"]].get_signature())} for o in outputs]
    roles = get_roles(extra)
    items += [{**{k: e[k] for k in ("id", "text", "call_id", "name")}, "signature": None,
               "role": list(roles[e["id"]]) if roles[e["id"]][0] != "function_call_output" else None}
              for e in extra]
    group = {"step": get_step_id(runtime.t), "kind": "tool", "tool": ",".join(sorted({o["name"] for o in outputs})),
             "config": runtime.get_config().get_record(), "items": items}
    return [group, *conv.record["held"]]


def forget_replayed(conv: Conversation, item_id: str):
    """Algorithm 1 on the store (one atomic commit), then the inputs its replay did not replay held
    in the sidecar, before those an earlier forget held; where it replayed every input, the held
    ones are replayed as far as they go. The forget's report."""
    runtime = conv.runtime
    clients = isinstance(runtime, ClientToolRuntime)
    steps, earlier = list(runtime.steps), get_earlier_held(conv) if clients else []
    configs = dict(runtime.client.configs) if clients else {}
    signatures = get_signatures(runtime) if clients else {}
    roles = dict(runtime.client.roles) if clients else {}
    report = conv.session.forget(item_id)
    outcome = report.extra.fields.get("client_tools", {"held": [], "held_bound": {}})
    held_steps = [s for s in steps if s.id in set(outcome["held"])]
    groups = (get_held(conv.runtime, held_steps, configs, signatures, conv.record["tools"], item_id, roles)
              if clients else [])
    outputs, extra = [], []
    if groups and groups[0]["kind"] == "tool":  # where the replay stopped: the outputs it matched wait
        outputs = get_held_outputs(conv, groups[0], outcome["held_bound"])
        extra, groups = get_held_extra(groups[0], outcome["held_bound"]), groups[1:]
    groups += earlier
    kept = {i["id"] for i in conv.get_items()} | {i["id"] for g in groups for i in g["items"]} | {
        o["id"] for o in outputs} | {e["id"] for e in extra}
    tools = {k: v for k, v in conv.record["tools"].items() if k in kept and k != item_id}
    conv.save({**conv.record, "tools": tools, "held": groups, "held_outputs": outputs, "held_extra": extra})
    if groups and not outcome.get("halted"):
        resume(conv, conv.runtime.engine)
    return report, bool(outcome.get("halted"))


def forget(conv: Conversation, item_id: str) -> dict:
    """An exact forget of ``item_id``, or of a waiting item; the DELETE reply's fields."""
    if forget_waiting(conv, item_id):
        return {"rewritten": [], "removed": [item_id], "receipt": None, "report": None, **get_status(conv)}
    before = conv.get_items()
    item = next((i for i in before if i["id"] == item_id), None)
    if item is None:
        raise not_found(f"no item {item_id!r} in conversation {conv.id}", param="item_id")
    if item_id not in {i.source for s in conv.runtime.steps for i in s.items}:
        if item["type"] == "compaction":
            raise bad_request(f"item {item_id!r} is a compaction summary the model wrote from the items before it, "
                              "not an input: delete the input item it should not hold, and the summary is rewritten "
                              "without it (docs/serve.md, 'Long conversations')", param="item_id")
        raise bad_request(f"item {item_id!r} is the model's ({item['type']}), derived from the items before it: "
                          "delete the input item it came from (a forget names a source)", param="item_id")
    report, halted = forget_replayed(conv, item_id)
    after = conv.get_items()
    after_ids, before_ids = {i["id"] for i in after}, {i["id"] for i in before}
    removed = [i["id"] for i in before if i["id"] not in after_ids]
    conv.save({**conv.record, "retired": conv.record["retired"] + removed})  # never taken again (assign_ids)
    return {"rewritten": [i for i in after if i["id"] not in before_ids],
            "removed": removed,
            "receipt": conv.session.receipt,  # canonical JSON text: what `unsee verify --receipt` reads
            "report": {"tau": report.tau, "length": report.length, "invocations": report.invocations,
                       "prefilled_tokens": report.prefilled_tokens, "decoded_tokens": report.decoded_tokens,
                       "forward_calls": report.forward_calls, "wall_s": report.wall_s, "assumptions": report.assumptions},
            **get_status(conv, halted)}


def get_status(conv: Conversation, halted: bool = False) -> dict:
    """Where the conversation stands after a delete: ``completed`` (every recorded input replayed),
    or ``pending`` (the replay waits for the client's outputs, with the recorded inputs it has not
    yet replayed); ``pending_calls``: the calls that wait for an output, in either."""
    record = conv.record
    held = record["held"] or record["held_outputs"] or record["held_extra"] or halted
    added = {p["id"] for p in record["pending"]}
    return {"status": "pending" if held else "completed", "pending_calls": conv.get_pending_calls(),
            "unreplayed": [i for i in get_waiting_items(record) if i["id"] not in added]}


__all__ = ["add_logprobs", "bind_outputs", "check_length", "forget", "forget_replayed", "forget_waiting",
           "get_config", "get_context_length", "get_earlier_held", "get_held", "get_held_extra", "get_held_outputs",
           "get_logprobs", "get_roles", "get_sampling", "get_status", "get_step", "get_tool_records", "respond",
           "resume", "run_step"]
