"""A conversation's turns (docs/serve.md, "Tools", "Forget with client-side tools"):

- :func:`respond`: a response's step under its config (instructions, tools,
  tool choice), its tool outputs bound to the calls of the last turn they
  answer; every check runs before the first write;
- :func:`forget`: the exact forget of an item (Algorithm 1 with the client
  tools' replay, :class:`~unsee.impl.agent.tools.client.ClientToolRuntime`);
  where the replay stopped at a call no recorded output answers, the
  recorded inputs it did not replay are *held* in the sidecar: the outputs
  it matched for that call's turn, then the rest step by step;
- :func:`resume`: after the client's outputs for that call, the held inputs
  replayed as the client would send them, until the next such call.

Each function runs with the conversation's lock and the engine's held (:meth:`~unsee.impl.serve.pool.Pool.hold`).
"""

from __future__ import annotations

from unsee import Item, PersistentSession, Settings, Step
from unsee.impl.agent.tools.client import ClientToolRuntime, Config, get_signatures, get_step_id, prepare_step
from unsee.impl.serve.conversation import Conversation, get_answer_items, get_call_ids, get_waiting_items
from unsee.impl.serve.errors import ApiError, bad_request, not_found


def get_context_length(lm) -> int | None:
    """The most tokens the model's context holds (llama.cpp's ``n_ctx``; vLLM's ``max_model_len``
    less the one position its engine keeps for the logits' request, the bound its ``prefill`` and
    ``generate`` raise past; a transformers model's position limit), or None where the engine
    does not say."""
    n = getattr(lm, "n_ctx", None)
    if isinstance(n, int) and n > 0:
        return n
    info = getattr(lm, "info", None)
    n = getattr(info.get("options"), "max_model_len", None) if isinstance(info, dict) else None
    if isinstance(n, int) and n > 1:
        return n - 1  # impl/engines/vllm/engine.py, _max_len
    n = getattr(getattr(getattr(lm, "model", None), "config", None), "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def check_length(engine, runtime, step: Step, config: Config, settings: Settings) -> None:
    """A turn that would pass the model's context (its prompt and its output cap): a 400 with code
    ``context_length_exceeded``, before anything is written."""
    limit = get_context_length(engine.lm)
    if limit is None or (runtime is not None and not isinstance(runtime, ClientToolRuntime)):
        return
    probe = runtime or ClientToolRuntime(engine, config.system, settings, config=config)
    prompt = probe.get_turn_length(step, config)
    if prompt + settings.max_new_tokens > limit:
        raise bad_request(f"input: this turn needs {prompt} tokens of context and up to {settings.max_new_tokens} "
                          f"of output, {prompt + settings.max_new_tokens} in all; the model's context holds "
                          f"{limit}", param="input", code="context_length_exceeded")


def get_config(conv: Conversation, req: dict) -> Config:
    """A response's config: its instructions (else the conversation's system prompt) and tools."""
    system = req["instructions"] if req["instructions"] is not None else conv.record["system"]
    return Config(system, req["tools"], req["choice"], req["function"], req["parallel"], req.get("format"))


def check_settings(conv: Conversation, sampling: dict, defaults: Settings) -> Settings:
    """The settings this response runs with: the conversation's (its first response fixed them),
    refused if the request asks for others."""
    if conv.session is None:
        return Settings(max_new_tokens=sampling["max_new_tokens"] or defaults.max_new_tokens,
                        temperature=sampling["temperature"] if sampling["temperature"] is not None
                        else defaults.temperature,
                        seed=sampling["seed"] if sampling["seed"] is not None else defaults.seed)
    settings = conv.runtime.settings
    fixed = {"temperature": settings.temperature, "seed": settings.seed, "max_new_tokens": settings.max_new_tokens}
    names = {"max_new_tokens": "max_output_tokens"}
    for key, value in sampling.items():
        if value is not None and value != fixed[key]:
            raise bad_request(f"{names.get(key, key)}: this conversation runs with {fixed[key]!r}, fixed by its "
                              f"first response (a forget replays every turn with the same settings); got "
                              f"{value!r}", param=names.get(key, key))
    return settings


def bind_outputs(conv: Conversation, todo: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """The step's items and which call each output answers: where the last turn made calls, the
    outputs must answer each call no held output answers, once (the OpenAI API's rule); the
    step holds the held outputs and these, in the calls' order. Without calls, outputs are
    recorded as they come (bound to no call)."""
    pending = conv.get_pending_calls()
    held = [{"kind": "function_call_output", "role": "tool", "id": o["id"], "text": o["text"],
             "call_id": o["call_id"], "name": o["name"]} for o in conv.record["held_outputs"]]
    if not pending and not held:
        return todo, {}
    waiting = [c["call_id"] for c in pending]
    if any(i["kind"] != "function_call_output" for i in todo):
        raise bad_request(f"input: the conversation ends in calls {waiting} that no output answers: send their "
                          "function_call_output items first", param="input", code="pending_tool_calls")
    runtime = conv.runtime
    ids = get_call_ids(runtime, runtime.steps[-1].id)
    bound = {o["id"]: o["call_index"] for o in conv.record["held_outputs"]}
    for item in todo:
        if item["call_id"] not in waiting or ids.index(item["call_id"]) in bound.values():
            raise bad_request(f"input: call_id {item['call_id']!r} names no call that waits for an output "
                              f"(waiting: {waiting})", param="input")
        bound[item["id"]] = ids.index(item["call_id"])
    missing = [c for c in waiting if ids.index(c) not in bound.values()]
    if missing:
        raise bad_request(f"input: no output for calls {missing}", param="input", code="pending_tool_calls")
    return sorted(held + todo, key=lambda i: bound[i["id"]]), bound


def get_step(conv: Conversation, items: list[dict]) -> Step:
    """The next step: user messages, or function outputs (never both)."""
    kinds = {i["kind"] for i in items}
    if len(kinds) > 1:
        raise bad_request("input: a turn is user messages or function_call_output items, not both: "
                          "add the outputs in a response of their own", param="input")
    step_id = get_step_id(conv.runtime.t if conv.runtime is not None else 0)
    observed = tuple(Item(i["id"], i["text"]) for i in items)
    if kinds == {"function_call_output"}:
        return Step(step_id, "tool", observed, ",".join(sorted({i["name"] for i in items})))
    return Step(step_id, "user", observed)


def run_step(conv: Conversation, engine, step: Step, config: Config, bound: dict, settings: Settings,
             listener=None) -> list[dict]:
    """Observe ``step`` under ``config`` and decode the answer, committed; the answer's items.
    The first step creates the store (a failed one leaves none: it would fix the settings)."""
    first = conv.session is None
    if first:
        runtime = ClientToolRuntime.start(engine, config.system, settings, config=config)
        conv.session = PersistentSession.create(conv.store_path, runtime)
    runtime = conv.runtime
    runtime.client.expect(config, bound)
    if listener is not None:
        listener.prepare(runtime.get_opening(config), runtime.get_openings(config))
        runtime.listener = listener
    try:
        conv.session.step(step)
    except BaseException:
        if first:
            conv.evict()
            conv.store_path.unlink(missing_ok=True)
        raise
    finally:
        runtime.listener = None
    items = get_answer_items(conv.runtime, step.id)
    if listener is not None:
        listener.answer(items)
    return items


def get_tool_records(items: list[dict]) -> dict:
    """The sidecar's record of tool outputs: the client's call id and tool name, by item id."""
    return {i["id"]: {"call_id": i["call_id"], "name": i["name"]} for i in items
            if i.get("kind", "function_call_output") == "function_call_output" and i.get("call_id")}


def respond(conv: Conversation, engine, req: dict, defaults: Settings, response_id: str,
            listener=None) -> tuple[list[dict], Settings]:
    """One response: the waiting items and the request's input observed as one step, the answer
    decoded and committed (then, where a forget held recorded inputs, their replay resumed); the
    output items and the settings the conversation runs with."""
    settings = check_settings(conv, {k: req[k] for k in ("temperature", "seed", "max_new_tokens")}, defaults)
    if conv.runtime is not None and not isinstance(conv.runtime, ClientToolRuntime) and (
            req["tools"] or req["instructions"] is not None):
        raise bad_request("tools and instructions: this conversation was stored before the server served them; "
                          "start a new one", param="tools")
    items = conv.assign_ids(conv.record, req["items"], conv.get_used_ids(), conv.get_next_turn())
    config = get_config(conv, req)
    todo, bound = bind_outputs(conv, conv.record["pending"] + items)
    step = get_step(conv, todo)  # refuses before anything is written
    check_length(engine, conv.runtime, step, config, settings)
    if listener is not None:
        listener.start(settings)
    out = run_step(conv, engine, step, config, bound, settings, listener)
    record = conv.record
    conv.save({**record, "pending": [], "held_outputs": [], "tools": {**record["tools"], **get_tool_records(todo)},
               "responses": record["responses"] + [{"id": response_id, "step": step.id}]})
    if conv.record["held"] and step.kind == "tool":
        out += resume(conv, engine, settings, listener)
    return out, settings


def resume(conv: Conversation, engine, settings: Settings, listener=None) -> list[dict]:
    """Replay the held recorded inputs as the client would send them now (:func:`prepare_step`),
    each under its recorded config, until one waits for a call's output (or would pass the
    model's context); the answers' items."""
    out = []
    while conv.record["held"]:
        group, rest = conv.record["held"][0], conv.record["held"][1:]
        step = Step(group["step"], group["kind"], tuple(Item(i["id"], i["text"]) for i in group["items"]),
                    group["tool"])
        signatures = {i["id"]: tuple(i["signature"]) for i in group["items"] if i.get("signature")}
        prepared = prepare_step(conv.runtime, step, signatures)
        config = Config.from_record(group["config"])
        if prepared.action == "halt":
            if group["kind"] == "tool":
                conv.save({**conv.record, "held": rest, "held_outputs": get_held_outputs(conv, group, prepared.bound)})
            break
        if prepared.action == "drop":
            conv.save({**conv.record, "held": rest})
            continue
        try:
            check_length(engine, conv.runtime, prepared.step, config, settings)
        except ApiError:
            break  # held until the client makes room (deletes an item)
        out += run_step(conv, engine, prepared.step, config, dict(prepared.bound), settings, listener)
        kept = [i for i in group["items"] if i["id"] in {x.source for x in prepared.step.items}]
        conv.save({**conv.record, "held": rest, "tools": {**conv.record["tools"], **get_tool_records(kept)}})
    return out


def get_held_outputs(conv: Conversation, group: dict, bound: dict[str, int]) -> list[dict]:
    """A held tool step's outputs that answer calls of the last turn, kept for the step the
    client's outputs for its other calls complete."""
    ids = get_call_ids(conv.runtime, conv.runtime.steps[-1].id)
    return [{"id": i["id"], "text": i["text"], "call_index": bound[i["id"]], "call_id": ids[bound[i["id"]]],
             "name": i["name"]} for i in group["items"] if i["id"] in bound]


def get_held(runtime, steps: list[Step], configs: dict, signatures: dict, tools: dict, item_id: str) -> list[dict]:
    """The sidecar's groups of recorded inputs a forget's replay did not replay (its ``steps``,
    as the run before the forget recorded them, less the forgotten item)."""
    groups = []
    for step in steps:
        items = [{"id": i.source, "text": i.text, "call_id": tools.get(i.source, {}).get("call_id"),
                  "name": tools.get(i.source, {}).get("name"), "signature": signatures.get(i.source)}
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
    held = [{**g, "items": [i for i in g["items"] if i["id"] != item_id]} for g in record["held"]]
    held = [g for g in held if g["items"]]
    if (pending, outputs, held) == (record["pending"], record["held_outputs"], record["held"]):
        return False
    conv.save({**record, "pending": pending, "held_outputs": outputs, "held": held,
               "retired": record["retired"] + [item_id]})
    return True


def get_earlier_held(conv: Conversation) -> list[dict]:
    """What an earlier forget holds, as groups a later one keeps after its own: the outputs kept
    for the calls that wait (one tool group, each with its call's signature), then the rest."""
    outputs, runtime = conv.record["held_outputs"], conv.runtime
    if not outputs:
        return list(conv.record["held"])
    calls = runtime.get_turn(runtime.steps[-1].id)[1]
    items = [{**{k: o[k] for k in ("id", "text", "call_id", "name")},
              "signature": list(calls[o["call_index"]].get_signature())} for o in outputs]
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
    report = conv.session.forget(item_id)
    outcome = report.extra.fields.get("client_tools", {"held": [], "held_bound": {}})
    held_steps = [s for s in steps if s.id in set(outcome["held"])]
    groups = get_held(conv.runtime, held_steps, configs, signatures, conv.record["tools"], item_id) if clients else []
    outputs = []
    if groups and groups[0]["kind"] == "tool":  # where the replay stopped: the outputs it matched wait
        outputs, groups = get_held_outputs(conv, groups[0], outcome["held_bound"]), groups[1:]
    groups += earlier
    kept = {i["id"] for i in conv.get_items()} | {i["id"] for g in groups for i in g["items"]} | {
        o["id"] for o in outputs}
    tools = {k: v for k, v in conv.record["tools"].items() if k in kept and k != item_id}
    conv.save({**conv.record, "tools": tools, "held": groups, "held_outputs": outputs})
    if groups and not outcome.get("halted"):
        resume(conv, conv.runtime.engine, conv.runtime.settings)
    return report, bool(outcome.get("halted"))


def forget(conv: Conversation, item_id: str) -> dict:
    """An exact forget of ``item_id``, or of a waiting item; the DELETE reply's fields."""
    if forget_waiting(conv, item_id):
        return {"rewritten": [], "removed": [item_id], "receipt": None, "report": None, **get_status(conv)}
    before = conv.get_items()
    item = next((i for i in before if i["id"] == item_id), None)
    if item is None:
        raise not_found(f"no item {item_id!r} in conversation {conv.id}", param="item_id")
    if item.get("role") == "assistant" or item["type"] == "function_call":
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
                       "wall_s": report.wall_s, "assumptions": report.assumptions},
            **get_status(conv, halted)}


def get_status(conv: Conversation, halted: bool = False) -> dict:
    """Where the conversation stands after a delete: ``completed`` (every recorded input replayed),
    or ``pending`` (the replay waits for the client's outputs, with the recorded inputs it has not
    yet replayed); ``pending_calls``: the calls that wait for an output, in either."""
    record = conv.record
    held = record["held"] or record["held_outputs"] or halted
    added = {p["id"] for p in record["pending"]}
    return {"status": "pending" if held else "completed", "pending_calls": conv.get_pending_calls(),
            "unreplayed": [i for i in get_waiting_items(record) if i["id"] not in added]}


__all__ = ["bind_outputs", "check_length", "check_settings", "forget", "forget_replayed", "forget_waiting",
           "get_config", "get_context_length", "get_earlier_held", "get_held", "get_held_outputs", "get_status",
           "get_step", "get_tool_records", "respond", "resume", "run_step"]
