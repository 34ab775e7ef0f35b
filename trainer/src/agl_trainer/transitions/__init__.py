"""Building transitions: from what the store holds about ended rollouts to training data.

For each ended rollout the builder

1. **joins** the framework's LLM spans (kind ``llm``) with the gateway's
   :class:`~agl.schema.LLMCall` records:

   - by response id: a span's ``gen_ai.response.id`` is the gateway's ``call_id``;
   - a span without a response id falls back to the order of calls in the rollout,
     *confirmed* by the request's messages: it takes the next not yet joined call
     whose request messages equal the span's ``gen_ai.input.messages``. If none
     does, the span is reported as unmatched (counted in :class:`BuildReport`,
     logged) and yields nothing: a call is never guessed;
   - a span whose response id the gateway never issued, or a span without one in a
     rollout with no gateway records left, had no gateway record: it yields a
     *text-only* transition (``token_source="text"``, empty token ids, the
     messages in ``prompt_messages`` / ``response_text``);
   - a second span with the response id of a call already joined (two tracers of one
     call: an SDK's own spans beside an instrumentation's) is counted
     (``duplicate_spans``) and yields nothing;
   - a gateway record no span claims (an agent with tracing off) is still a
     transition, with ``agent=None``.

2. **rewards** the rollout. Reward plugins (hook ``agl_reward``) run first and
   what they return is stored as :class:`~agl.schema.Reward` rows whose source is
   the plugin's name. The final reward is, in this order of precedence:

   1. the reward the agent function *returned* (stored by the runner, source ``return``);
   2. a reward plugin's answer (a number, or the ``reward`` key of a dict);
   3. the last reward named ``reward`` emitted during the run (``agl.emit_reward``);
   4. for a failed or timed-out rollout, ``failed_reward`` (None drops it);
      for a succeeded one, ``missing_reward`` (None drops it, counted).

   Every other emitted reward is an intermediate reward, placed after the last
   call made before it (by time), for the ``emitted`` credit strategy.

   Who may write what: ``return`` is written by the runner only (a rollout key, which
   is what an agent holds, is refused it by the store server: see
   :data:`agl.schema.TRUSTED_SOURCES`); the agent writes every other source. When a
   reward plugin answers for a rollout, the plugin wins over everything the agent
   wrote: with ``agent_rewards="without_plugin"`` (the default) the agent's rewards of
   that rollout are left out altogether, neither final nor intermediate (counted as
   ``agent_rewards_ignored``), because agents run model-written code that could
   reward itself; ``agent_rewards="always"`` keeps them as intermediate rewards beside
   the plugin's final one. Where no plugin answers, the agent's rewards count as above.

3. **assigns credit** with the strategy named in the config, resolved through the
   plugin registry, over every call of the rollout in order (all agents), then
   keeps only the calls of the selected agents (``agents``; None keeps all), and
   sets ``weight = 1 / (calls kept in the rollout)`` when ``normalize="rollout"``
   so a rollout with many calls does not outweigh one with few in its group.

4. **merges** (``merge="prefix"``; off by default) each run of the rollout's kept calls
   whose token ids extend each other into one row: see :mod:`~agl_trainer.transitions.merge`.
   Each call keeps its own reward and weight on the tokens it generated
   (:attr:`~agl.schema.Transition.segments`); the build report counts the calls merged and
   the breaks by reason.

Records of an earlier attempt of a retried rollout (made before the last attempt
started) are left out and counted; they stay in the store.

Where the records come from is the builder's *reader* (:class:`~agl_trainer.transitions.readers.Reader`):
:class:`SqlReader` reads a SQL store (the embedded SQLite store, PostgreSQL) through its
bulk reads (:meth:`~agl.store.base.Store.transition_rows` and its siblings, which a SQL
store answers from its columns: only the fields the build needs, token blobs unpacked straight into arrays,
JSON fields extracted by the database); :class:`GenericReader` goes through the public
:class:`~agl.store.Store` queries and works on any store (HTTP). A builder reads through
the reader it is given (``TransitionBuilder(store, config, reader=GenericReader(store))``),
else :func:`reader_for`'s choice for its store. Either way it streams: one chunk of
rollouts at a time, the next chunk read on a helper thread while this one is built.

The package, one concern a module; every name one module uses from another is public
and documented in the module that owns it:

- :mod:`~agl_trainer.transitions.config`: :class:`TransitionConfig` and :class:`BuildReport`;
- :mod:`~agl_trainer.transitions.records`: the call, span, reward and step records the join
  works on (:class:`~agl_trainer.transitions.records.CallRecord`,
  :class:`~agl_trainer.transitions.records.SpanRecord`, ...) and a reader's
  :class:`~agl_trainer.transitions.records.Chunk` of them;
- :mod:`~agl_trainer.transitions.readers`: the :class:`~agl_trainer.transitions.readers.Reader`
  protocol, :class:`SqlReader`, :class:`GenericReader` and :func:`reader_for`;
- :mod:`~agl_trainer.transitions.messages`: message normalisation and extraction
  (:func:`normalize_messages`, :func:`request_messages`, :func:`response_text`, ...);
- :mod:`~agl_trainer.transitions.rewards`: reward plugins
  (:func:`~agl_trainer.transitions.rewards.plugin_rewards`), :func:`final_reward`'s precedence,
  where an emitted reward goes (:func:`~agl_trainer.transitions.rewards.index_before`);
- :mod:`~agl_trainer.transitions.merge`: :func:`~agl_trainer.transitions.merge.merge_prefix` and its break reasons;
- :mod:`~agl_trainer.transitions.builder`: :class:`TransitionBuilder` and :func:`build_transitions`;
  a rollout goes through its steps in turn: its records, the join, the rewards, credit,
  then the selection of agents and the weighting, then the merge.
"""

from agl.schema import RETURN_SOURCE as RETURN_SOURCE
from agl_trainer.transitions.builder import CHUNK as CHUNK
from agl_trainer.transitions.builder import TransitionBuilder, build_transitions
from agl_trainer.transitions.config import BuildReport, TransitionConfig
from agl_trainer.transitions.messages import normalize_messages, request_messages, response_text
from agl_trainer.transitions.readers import GenericReader, Reader, SqlReader, reader_for
from agl_trainer.transitions.rewards import final_reward

__all__ = [
    "BuildReport",
    "GenericReader",
    "Reader",
    "SqlReader",
    "TransitionBuilder",
    "TransitionConfig",
    "build_transitions",
    "final_reward",
    "normalize_messages",
    "reader_for",
    "request_messages",
    "response_text",
]
