"""Tools a client runs: a runtime whose turns are rendered under per-step
instructions and tool definitions, whose model writes calls in its own
format, and whose replay reuses a recorded tool output only where the
replayed model makes the same call (issue 38; docs/serve.md).

A step of a :class:`ClientToolRuntime` is a ``user`` step (messages) or a
``tool`` step (the outputs of the calls the model's last turn made, first);
either may hold items of other roles a client writes (assistant messages,
its own calls, system messages: :mod:`.observed`), each recorded with its
role and rendered in it. Each
step runs under a :class:`Config`: the system text, the tool definitions,
the tool choice. The config is recorded per step (the :class:`ClientTools`
extension), so a forget's replay runs every step as it ran:

- where a step's system block (the system text with the tools' definitions,
  as the model's template renders them) differs from the live one, the
  context is re-rendered under it on a new lineage, as a compaction opens a
  new context: the new system block, then a copy of every other context
  block prefilled in its recorded chunks;
- a turn whose tool choice is ``required`` or one function opens with the
  template's call up to the tool's name (or its arguments), so the model
  writes a call;
- a ``tool`` step's outputs are prefilled in the template's tool role, one
  segment each (without a native call format: as the base runtime does).

The replay (:meth:`ClientToolRuntime.run` while replaying) re-feeds the
recorded inputs as the client would (:func:`prepare_step`): a recorded
output is reused where the replayed turn makes the call it answered (same
name, same canonical arguments: A3's shadow execution, for a tool the
server never runs); outputs of calls the replayed turn does not make are
dropped, and a tool step left with nothing to answer is dropped; at the
first call no recorded output answers, the replay stops (the server cannot
run the client's tool) and the remaining recorded inputs are *held*: the
report names them, and the client's outputs resume them. Steps are numbered
``turn_1, turn_2, ...`` by their position, so a replay that drops a step
numbers the ones after it as a twin that never had it does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

import attrs
import torch

from unsee.impl.agent.checkpoints import Checkpoint
from unsee.impl.agent.episode import Settings, Step
from unsee.impl.agent.extensions import Extension
from unsee.impl.agent.forget import Progress
from unsee.impl.agent.provenance import RuntimeBlock
from unsee.impl.agent.render import TEMPLATE_NAMES
from unsee.impl.agent.runtime import AgentRuntime
from unsee.impl.agent.tools.config import Config, Sampling, get_context_length
from unsee.impl.agent.tools.families import describe_tools, get_tool_format
from unsee.impl.agent.tools.grammars import get_constraints
from unsee.impl.agent.tools.native import OPENINGS, CallFormat, FunctionCall, parse_turn, split_reasoning
from unsee.impl.agent.tools.observed import Role, get_call, get_runs, get_tool_label, has_roles
from unsee.impl.engines.decoding import PLAIN, Rule
from unsee.impl.engines.protocol import Engine, ForwardHooks
from unsee.impl.engines.stops import StopTexts, cut_at_stop, find_stop
from unsee.impl.util.ids import ANSWER, SYSTEM, compute_block_id

#: The name the extension is recorded under (the session record's ``extra``).
CLIENT = "client_tools"
CHOICES = ("auto", "none", "required", "function")
_STEP_ID = re.compile(r"^turn_\d+$")


def get_step_id(t: int) -> str:
    """The id of the step after ``t`` observed ones: steps are numbered by position."""
    return f"turn_{t + 1}"


@attrs.define
class Outcome:
    """What a replay did with the recorded steps (ids only: the report is stored)."""

    held: list[str] = attrs.Factory(list)  # original step ids not replayed (the first where it stopped)
    held_bound: dict[str, int] = attrs.Factory(dict)  # outputs of the first held step the stop reuses
    dropped: list[str] = attrs.Factory(list)  # outputs whose call the replayed turns do not make
    skipped: list[str] = attrs.Factory(list)  # tool steps left with no output to give

    def get_record(self) -> dict:
        return {"held": list(self.held), "held_bound": dict(self.held_bound), "dropped": list(self.dropped),
                "skipped": list(self.skipped), "halted": bool(self.held)}


@attrs.frozen
class Prepared:
    """A recorded step, as the client would send it now (:func:`prepare_step`): ``action`` is
    ``run`` (``step``, renumbered), ``drop`` (nothing to answer) or ``halt`` (a call of the last
    turn has no recorded output); ``bound``: each kept output's call (an index into the last
    turn's calls); ``dropped``: outputs of calls that turn does not make."""

    step: Step
    action: str
    bound: Mapping[str, int]
    dropped: tuple[str, ...]


class ClientTools:
    """The runtime's record of each step's :class:`Config`, of which call each tool output
    answers and of the role of each item not of its step kind's role (:mod:`.observed`; an
    :class:`~unsee.impl.agent.extensions.Extension`); in a replay, also what the original run
    recorded and the calls its outputs answered (by signature)."""

    name = CLIENT

    def __init__(self, initial: Config, configs: Mapping[str, Config] | None = None,
                 bound: Mapping[str, int] | None = None, roles: Mapping[str, Role] | None = None):
        self.initial = initial
        self.configs: dict[str, Config] = dict(configs or {})
        self.bound: dict[str, int] = dict(bound or {})  # output source id -> index of the call it answers
        self.roles: dict[str, Role] = {k: tuple(v) for k, v in (roles or {}).items()}  # source id -> its role
        # the next step's config, bindings and roles, set before it
        self.upcoming: tuple[Config, Mapping[str, int], Mapping[str, Role]] | None = None
        self.recorded: dict[str, Config] = {}  # a replay's: the original steps' configs
        self.recorded_roles: dict[str, Role] = {}  # a replay's: the original items' roles
        self.signatures: dict[str, tuple[str, str]] = {}  # a replay's: each output's call, as the original made it
        self.outcome = Outcome()
        self.last_outcome = Outcome()

    def expect(self, config: Config, bound: Mapping[str, int] | None = None,
               roles: Mapping[str, Role] | None = None) -> None:
        """The next step runs under ``config``, its outputs answering the calls ``bound`` names,
        its items of other roles than its kind's in ``roles``."""
        self.upcoming = (config, dict(bound or {}), dict(roles or {}))

    def take(self, step: Step, current: Config) -> Config:
        """Record the step's config, bindings and roles (the upcoming ones; else ``current``,
        binding nothing; a replay's roles are the recorded ones, by source id)."""
        config, bound, roles = self.upcoming or (current, {}, {})
        self.upcoming = None
        sources = {x.source for x in step.items}
        self.configs[step.id] = config
        self.bound.update({source: i for source, i in bound.items() if source in sources})
        given = {**{s: r for s, r in self.recorded_roles.items() if s in sources}, **roles}
        self.roles.update({s: tuple(r) for s, r in given.items() if s in sources})
        return config

    # --- the Extension protocol ------------------------------------------------

    def after_plan(self, runtime, step: Step, plan: RuntimeBlock) -> None:
        """Plans are not a client-tool session's steps."""

    def take_snapshot(self, runtime) -> str | None:
        return None

    def branch(self, runtime, checkpoint: Checkpoint | None) -> ClientTools:
        """A replay's: the configs and bindings of the steps before the checkpoint, and the
        original run's configs and call signatures to replay the rest against."""
        kept = {s.id for s in runtime.steps[:checkpoint.boundary if checkpoint else 0]}
        sources = {i.source for s in runtime.steps if s.id in kept for i in s.items}
        other = ClientTools(self.initial, {k: v for k, v in self.configs.items() if k in kept},
                            {k: v for k, v in self.bound.items() if k in sources},
                            {k: v for k, v in self.roles.items() if k in sources})
        other.recorded = dict(self.configs)
        other.recorded_roles = dict(self.roles)
        other.signatures = get_signatures(runtime)
        return other

    def begin_forget(self, runtime, source_ids: Sequence[str]) -> None:
        self.last_outcome = Outcome()

    def adopt(self, other: ClientTools) -> None:
        self.configs, self.bound, self.last_outcome = dict(other.configs), dict(other.bound), other.outcome
        self.roles = dict(other.roles)

    def get_report_fields(self) -> dict:
        return {CLIENT: self.last_outcome.get_record()}

    def get_assumptions(self, assumptions: dict) -> dict:
        why = ("the client runs its tools, the server none: a replayed call reuses the recorded output of the "
               "same call (name and canonical arguments); at a call with none the replay stops until the "
               "client's output")
        return assumptions | {"A3": {"holds": True, "why": why}}

    def get_state_fields(self) -> dict:
        """The state's client fields (``roles`` only where a step recorded one: an older
        session's digest is unchanged)."""
        fields = {"configs": {k: v.get_key() for k, v in sorted(self.configs.items())},
                  "bound": dict(sorted(self.bound.items()))}
        if self.roles:
            fields["roles"] = {k: list(v) for k, v in sorted(self.roles.items())}
        return {CLIENT: fields}

    def get_record(self) -> dict:
        unique = list({c.get_key(): c for c in [self.initial, *self.configs.values()]}.values())
        keys = [c.get_key() for c in unique]
        record = {"initial": keys.index(self.initial.get_key()), "configs": [c.get_record() for c in unique],
                  "by_step": {k: keys.index(v.get_key()) for k, v in self.configs.items()},
                  "bound": dict(self.bound)}
        if self.roles:
            record["roles"] = {k: list(v) for k, v in self.roles.items()}
        return record

    @classmethod
    def from_record(cls, record: dict) -> ClientTools:
        configs = [Config.from_record(c) for c in record["configs"]]
        return cls(configs[record["initial"]], {k: configs[i] for k, i in record["by_step"].items()},
                   record["bound"], record.get("roles"))

    def fork(self) -> ClientTools:
        return ClientTools(self.initial, self.configs, self.bound, self.roles)


class ClientToolRuntime(AgentRuntime):
    """A runtime whose steps run under per-step configs (see the module docstring). ``listener``,
    where set, is told the prompt and then the tokens of each turn as they are decoded
    (:meth:`_watch_turn`); a replay tells it nothing."""

    def __init__(self, engine: Engine, system: str, settings: Settings = Settings(), *,
                 extensions: Iterable[Extension] | None = None, config: Config | None = None):
        if extensions is None:
            extensions = [ClientTools(config or Config(system))]
        super().__init__(engine, system, settings, extensions=extensions)
        client = self.get_extension(CLIENT)
        if not isinstance(client, ClientTools):
            raise TypeError(f"a ClientToolRuntime needs a ClientTools extension; got {self.extensions}")
        self.client: ClientTools = client
        self.call_format: CallFormat = get_model_tool_format(self.renderer, engine.lm, settings.template)
        self.listener = None
        #: how many alternatives a turn's log-probabilities list (None: none collected); set by
        #: the server around a request's step, never in a replay (log-probabilities are not state)
        self.logprobs: int | None = None
        #: the last decoded turn's log-probabilities, by position in the turn (get_turn_settings)
        self.decisions: dict[int, tuple[int, float, tuple[tuple[int, float], ...]]] = {}

    def get_config(self, step_id: str | None = None) -> Config:
        """The config ``step_id`` ran under; without one, the last step's (the initial before any)."""
        if step_id is None:
            step_id = self.steps[-1].id if self.t else None
        return self.client.configs.get(step_id, self.client.initial) if step_id else self.client.initial

    def render_first(self, config: Config | None = None) -> str:
        """The system block of ``config`` (default: the current one): its system text and tools."""
        config = config or self.get_config()
        tools = config.get_definitions()
        if tools and not (self.renderer.segments.tool_definitions and self.renderer.template is not None):
            # a template with no tools format of its own: the tools described in the system prompt
            described = describe_tools(self.call_format, tools)
            return self.renderer.render_first(f"{config.system}\n\n{described}" if config.system else described)
        return self.renderer.render_first(config.system, tools, self.engine.lm.encode, self.engine.lm.name)

    def get_openings(self, config: Config) -> tuple[str, ...]:
        """Where a call may open in a turn under ``config``: nowhere without tools to call; only
        at the template's marker where the turn answers in a response format (a JSON answer is
        not a call); else at every opening the model's family writes (native.OPENINGS)."""
        if not config.get_names():
            return ()
        return ("marker",) if config.format is not None else OPENINGS

    def get_opening(self, config: Config) -> str:
        """What a turn under ``config`` opens with after the assistant header: a call, where the
        tool choice requires one (up to the name; with one function, up to its arguments)."""
        if config.choice == "required":
            return self.call_format.opening
        if config.choice == "function" and config.function:
            return self.call_format.opening + config.function + self.call_format.between.rstrip()
        return ""

    # --- decoding -------------------------------------------------------------------

    def get_turn_settings(self, config: Config) -> tuple[Settings, Rule]:
        """The settings and decoding rule of a turn under ``config``: the session's settings with
        the step's own temperature, seed and cap (:class:`Sampling`), the cap cut to what the
        context has left after the prompt (the turn's header is prefilled when this is asked);
        a rule with the step's nucleus, penalties and stop texts, and, where the server asked
        for log-probabilities (:attr:`logprobs`) outside a replay, a hook that collects them in
        :attr:`decisions`. A runtime that adds constraints of its own (a grammar) adds them to
        this rule's."""
        sampling = config.sampling
        settings = sampling.get_settings(self.settings)
        limit = get_context_length(self.engine.lm)
        if limit is not None:
            left = limit - len(self.engine.tokens(self.lineage))
            settings = attrs.evolve(settings, max_new_tokens=max(1, min(settings.max_new_tokens, left)))
        stops = (StopTexts(self.engine.lm.decode, sampling.stop, self.engine.lm.eos_ids),) if sampling.stop else ()
        self.decisions = {}
        hook = None
        if self.logprobs is not None and not self.replaying:
            hook = functools.partial(collect_decision, self.decisions, self.logprobs)
        rule = Rule(top_p=sampling.top_p, frequency_penalty=sampling.frequency_penalty,
                    presence_penalty=sampling.presence_penalty, constraints=stops, on_decision=hook)
        return settings, PLAIN if rule == PLAIN else rule  # the plain rule's fast paths (vLLM's greedy requests)

    def get_turn_rule(self, header: Sequence[int]) -> tuple[Settings, Rule | None]:
        """A user or tool step's answer is decoded under its config: its settings, nucleus,
        penalties and stop texts (:meth:`get_turn_settings`) and its grammar (the call it must
        write, the calls it may write, its response format: :func:`get_constraints`); other
        turns as the base runtime decodes them."""
        if not self.t or self.steps[-1].kind not in ("user", "tool"):
            return super().get_turn_rule(header)
        config = self.get_config()
        settings, rule = self.get_turn_settings(config)
        constraints = get_constraints(self.engine.lm, self.call_format, config.get_definitions(), config.choice,
                                      config.function, config.parallel, config.get_format())
        if not constraints:
            return settings, rule
        return settings, dataclasses.replace(rule, constraints=rule.constraints + constraints)

    # --- the transition ----------------------------------------------------------

    def _observe(self, step: Step) -> str:
        """A user or tool step under the config the client sent with it (a new system block
        re-renders the context first); the turn answering it opens as that config's tool
        choice requires. Other kinds as the base runtime observes them."""
        if step.kind not in ("user", "tool"):
            return super()._observe(step)
        config = self.client.take(step, self.get_config(self.steps[-2].id if self.t > 1 else None))
        first = self.render_first(config)
        if self.context and self.graph[self.context[0]].text != first:
            self._rerender(step, first)
        own = frozenset(i.source for i in step.items)
        self.append_block(step.id, "tool" if step.kind == "tool" else "user", self.get_observation(step),
                          parents=tuple(self.context), sources=self.get_resident_sources() | own)
        return self.get_opening(config)

    def get_observation(self, step: Step, roles: Mapping[str, Role] | None = None) -> str:
        """The block a step's observation is prefilled as, after the live context: tool outputs
        in the template's tool role, one segment each (a model turn's calls answered), else the
        base runtime's rendering; a step with items of other roles (``roles``, default the
        recorded ones) as its runs of messages, each in its role (:mod:`.observed`)."""
        roles = self.client.roles if roles is None else roles
        if has_roles(roles, step):
            runs = [self.render_run(step, run, items) for run, items in get_runs(roles, step)]
            return "".join(self.render_block(*run) if n == 0 else self.renderer.render_message(*run)
                           for n, run in enumerate(runs))
        if step.kind == "tool" and self.renderer.has_native_calls():
            text = "".join(self.renderer.get_call_result(step.tool or "", "", i.text)[1] for i in step.items)
            return self.render_block("tool", text)
        return self.render_block(*self.renderer.get_message(step))

    def render_run(self, step: Step, run: str, items: list) -> tuple[str, str]:
        """``(role, text)`` of one run of a step's items (:func:`~.observed.get_runs`), as the
        step would render it were it the run's alone: outputs as a tool step's, messages as a
        user step's; assistant messages then calls as the template writes a turn with calls."""
        if run == "tool":
            if self.renderer.has_native_calls():
                return "tool", "".join(self.renderer.get_call_result("", "", i.text)[1] for i, _ in items)
            return self.renderer.get_message(Step(step.id, "tool", tuple(i for i, _ in items),
                                                  get_tool_label(step, items)))
        if run == "assistant":
            text = "\n".join(i.text for i, role in items if role[0] == "assistant")
            calls = [get_call(i, role) for i, role in items if role[0] == "function_call"]
            return "assistant", self.call_format.render_turn(text, calls) if calls else text
        return run, "\n".join(i.text for i, _ in items)

    def get_turn_length(self, step: Step, config: Config, roles: Mapping[str, Role] | None = None) -> int:
        """The tokens the context holds once ``step`` is observed under ``config`` (its items'
        ``roles``) and its turn's header prefilled: what a turn needs before its output (a
        request is refused past the model's context before any write)."""
        encode = self.engine.lm.encode
        first = encode(self.render_first(config))
        base = len(first)
        if self.context:
            base += len(self.engine.tokens(self.lineage)) - len(self.graph[self.context[0]].tokens)
        header = encode(self.renderer.render_header(self.get_opening(config)))
        return base + len(encode(self.get_observation(step, roles))) + len(header)

    def _rerender(self, step: Step, first: str) -> None:
        """The context under a new system block (a new lineage): the block, then a copy of every
        other context block, prefilled in its recorded chunks (the KV a twin computes the same way)."""
        blocks = [self.graph[b] for b in self.context[1:]]
        ids = tuple(self.engine.lm.encode(first))
        lineage = self.engine.new_lineage()
        self.engine.prefill(lineage, list(ids))
        self._update(lineage=lineage, context=())
        self.commit_block(RuntimeBlock(compute_block_id(step.id, SYSTEM), "system", first, ids, (), frozenset(), (0, len(ids)),
                                       self.t))
        for n, block in enumerate(blocks, start=1):
            start = len(self.engine.tokens(self.lineage))
            for chunk in block.get_chunks():
                self.engine.prefill(self.lineage, chunk)
            self.commit_block(attrs.evolve(block, id=f"{step.id}/context/{n}", parents=(block.id,),
                                           token_span=(start, start + len(block.tokens)), turn=self.t,
                                           committed=False))

    @contextlib.contextmanager
    def _watch_turn(self, block_id: str) -> Iterator[None]:
        """Tell ``listener`` the turn's tokens after each forward (where the engine reports
        forwards); the tokens are the lineage's past the prompt, so a turn decoded the
        reference way reports each decided token as it is fed, and all of them, as committed,
        at the end."""
        listener = self.listener
        if listener is None or self.replaying or not isinstance(self.engine, ForwardHooks):
            yield
            return
        prompt = self.engine.tokens(self.lineage)
        listener.begin(block_id, prompt)
        start = len(prompt)
        with self.engine.hook_forwards(lambda n, started: listener.tokens(self.engine.tokens(self.lineage)[start:])):
            yield
        listener.tokens(self.engine.tokens(self.lineage)[start:])

    # --- reading turns -------------------------------------------------------------

    def get_turn(self, step_id: str) -> tuple[str, tuple[FunctionCall, ...], bool]:
        """``(text, calls, well_formed)`` of the model's answer to ``step_id`` under its config
        (:func:`~unsee.impl.agent.tools.native.parse_turn`; past the first call where the config
        allows one call only)."""
        config = self.get_config(step_id)
        block = self.graph[compute_block_id(step_id, ANSWER)]
        opening = self.get_opening(config)
        said = split_reasoning(cut_at_stop(block.text, config.sampling.stop))[1]  # the stop text is not returned
        text, calls, ok = parse_turn(self.call_format, opening + said if opening else said, config.get_names(),
                                     self.get_openings(config))
        return text, calls if config.parallel else calls[:1], ok

    def get_reasoning(self, step_id: str) -> str:
        """The reasoning the model's answer to ``step_id`` opened with (its ``<think>`` block), or ""."""
        block = self.graph[compute_block_id(step_id, ANSWER)]
        return split_reasoning(cut_at_stop(block.text, self.get_config(step_id).sampling.stop))[0]

    def is_finished(self, step_id: str) -> bool:
        """Whether the answer to ``step_id`` ended on its own (an end of turn, or a stop text of
        its config) rather than at its output cap."""
        block = self.graph[compute_block_id(step_id, ANSWER)]
        if block.tokens and block.tokens[-1] in set(self.engine.lm.eos_ids):
            return True
        return find_stop(block.text, self.get_config(step_id).sampling.stop) is not None

    def get_pending_calls(self) -> tuple[FunctionCall, ...]:
        """The calls the last turn made (a client answers them with the next step)."""
        return self.get_turn(self.steps[-1].id)[1] if self.t else ()

    def get_prompt(self, step_id: str) -> list[int]:
        """The tokens the answer to ``step_id`` was decoded after (its context and header)."""
        block = self.graph[compute_block_id(step_id, ANSWER)]
        header = self.engine.lm.encode(self.renderer.render_header(self.get_opening(self.get_config(step_id))))
        return [t for p in block.parents for t in self.graph[p].tokens] + list(block.tokens[:len(header)])

    # --- the replay ----------------------------------------------------------------

    def run(self, steps: Iterable[Step], progress: Progress | None = None) -> None:
        """While replaying: each recorded step as the client would send it (:func:`prepare_step`),
        under its recorded config; the rest held from the first call no recorded output answers."""
        if not self.replaying:
            return super().run(steps, progress)
        steps, outcome = list(steps), self.client.outcome
        for i, step in enumerate(steps, start=1):
            if outcome.held:
                outcome.held.append(step.id)
                continue
            prepared = prepare_step(self, step, self.client.signatures)
            outcome.dropped.extend(prepared.dropped)
            if prepared.action == "halt":
                outcome.held.append(step.id)
                outcome.held_bound.update(prepared.bound)
            elif prepared.action == "drop":
                outcome.skipped.append(step.id)
            else:
                self.client.expect(self.client.recorded.get(step.id, self.get_config()), prepared.bound)
                self.step(prepared.step)
            if progress:
                progress(i, len(steps))


def get_model_tool_format(renderer, lm, template: str | None) -> CallFormat:
    """The call format of ``lm`` under the episode's template override (:func:`get_tool_format`):
    the family of the Jinja template rendered, ``lm.tool_format`` (``--tool-format``) where set."""
    text = template if template not in (None, *TEMPLATE_NAMES) else \
        getattr(lm, "chat_template", None) if template != "chatml" else None
    return get_tool_format(renderer, text, getattr(lm, "tool_format", None))


def collect_decision(decisions: dict, n: int, position: int, token: int, scores: torch.Tensor) -> None:
    """Record a turn's decision at ``position`` (the last call for a position wins: a fallback
    decides it again): the chosen token's log-probability under ``scores`` (the logits after
    penalties and masks, before temperature) and the ``n`` most likely tokens'."""
    logprobs = torch.log_softmax(scores.to(torch.float32), dim=-1)
    top = torch.topk(logprobs, min(n, logprobs.shape[-1])) if n else None
    alternatives = () if top is None else tuple(
        (int(i), float(v)) for v, i in zip(top.values, top.indices) if math.isfinite(float(v)))
    decisions[position] = (int(token), float(logprobs[token]), alternatives)


def get_signatures(runtime: ClientToolRuntime) -> dict[str, tuple[str, str]]:
    """Each bound tool output's call as the run made it (name, canonical arguments), by source id."""
    out, previous = {}, None
    for step in runtime.steps:
        if step.kind == "tool" and previous is not None:
            calls = runtime.get_turn(previous)[1]
            for item in step.items:
                i = runtime.client.bound.get(item.source)
                if i is not None and i < len(calls):
                    out[item.source] = calls[i].get_signature()
        previous = step.id
    return out


def prepare_step(runtime: ClientToolRuntime, step: Step, signatures: Mapping[str, tuple[str, str]]) -> Prepared:
    """A recorded step as the client would send it after the runtime's last turn: a tool step
    keeps the outputs whose call (``signatures``) that turn makes, each bound to it, and drops
    the others; an output bound to no call is kept as recorded. The step halts where a call of
    that turn has no output (a user step after a turn with calls halts too), and is dropped
    where it has nothing left to give; it is renumbered to follow the runtime's steps."""
    calls = runtime.get_pending_calls()
    renumbered = step.id if not _STEP_ID.match(step.id) else get_step_id(runtime.t)
    if step.kind != "tool":
        return Prepared(attrs.evolve(step, id=renumbered), "halt" if calls else "run", {}, ())
    kept, bound, dropped = [], {}, []
    for item in step.items:
        signature = signatures.get(item.source)
        free = [k for k, c in enumerate(calls) if k not in bound.values() and c.get_signature() == signature]
        if signature is not None and not free:
            dropped.append(item.source)
            continue
        if free:
            bound[item.source] = free[0]
        kept.append(item)
    action = "halt" if len(set(bound.values())) < len(calls) else "run" if kept else "drop"
    return Prepared(attrs.evolve(step, id=renumbered, items=tuple(kept)), action, bound, tuple(dropped))


__all__ = [
    "CHOICES",
    "CLIENT",
    "ClientToolRuntime",
    "ClientTools",
    "Config",
    "Outcome",
    "Prepared",
    "Sampling",
    "collect_decision",
    "get_context_length",
    "get_model_tool_format",
    "get_signatures",
    "get_step_id",
    "prepare_step",
]
