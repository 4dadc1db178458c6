"""What the declared channels carried and lost, per step.

Each step with declared channels leaves two kinds of counts
(``lab/hubs.py``): the hub's own (``<probe>.hub-HOST.stats.json``: per
channel put, got, consumed, dropped when full or with no consumer,
skipped, timeouts; for the hub's network input: items in, incomplete and
missing UDP items, refused puts) and those of the remote ends each process
opened (``<process>.channels.jsonl``: a producer's sent; a consumer's
arrived, got, skipped, dropped, incomplete, missing). Nothing a channel
dropped is silent: every loss is a column here and in the report.

``RUN/tables/channels.parquet``: one row per step, channel and side
(``hub-HOST`` or the process), ``role`` one of channel / hub input /
producer / consumer.
"""

from __future__ import annotations

import json

import polars as pl

from loopscope.rundir import RunRecord, Step
from loopscope.trace.files import Files

COUNTS = [
    "put",
    "sent",
    "arrived",
    "got",
    "consumed",
    "dropped_full",
    "dropped_no_consumer",
    "skipped",
    "timeouts",
    "refused",
    "incomplete",
    "missing",
    "bytes",
]
SCHEMA = {
    "rep": pl.Int64,
    "phase": pl.String,
    "probe": pl.String,
    "channel": pl.String,
    "side": pl.String,
    "host": pl.String,
    "role": pl.String,
    **{k: pl.Int64 for k in COUNTS},
}


#: one row of the channels table: the step's and the channel's names, then each count (None: not counted there)
ChannelRow = dict[str, int | str | None]


def _row(st: Step, channel: str, side: str, host: str, role: str, **counts: float | None) -> ChannelRow:
    return {
        "rep": st.rep,
        "phase": st.phase,
        "probe": st.probe,
        "channel": channel,
        "side": side,
        "host": host,
        "role": role,
        **{k: (int(v) if (v := counts.get(k)) is not None else None) for k in COUNTS},
    }


def channel_stats(run: RunRecord, files: Files) -> pl.DataFrame:
    rows: list[ChannelRow] = []
    for st in run.steps:
        for h in st.hubs or []:
            try:
                text = files.text(h.stats) if h.stats else None
                s = json.loads(text) if text is not None else None
            except ValueError:
                s = None
            if not isinstance(s, dict):
                rows.append(_row(st, "(all)", h.name, h.host, "hub stats missing"))
                continue
            for name, c in (s.get("channels") or {}).items():
                rows.append(
                    _row(
                        st,
                        name,
                        h.name,
                        h.host,
                        "channel",
                        put=c.get("put"),
                        got=c.get("got"),
                        consumed=c.get("consumed"),
                        dropped_full=c.get("dropped_full"),
                        dropped_no_consumer=c.get("dropped_no_consumer"),
                        skipped=c.get("skipped"),
                        timeouts=(c.get("put_timeouts") or 0) + (c.get("get_timeouts") or 0),
                        bytes=c.get("bytes_put"),
                    )
                )
            n = s.get("net") or {}
            rows.append(
                _row(
                    st,
                    "(all)",
                    h.name,
                    h.host,
                    "hub input",
                    arrived=n.get("items_in"),
                    refused=n.get("refused"),
                    incomplete=n.get("incomplete"),
                    missing=n.get("missing"),
                    bytes=n.get("bytes_in"),
                )
            )
        procs = [(p.name, p.host, p.channel_stats) for p in st.processes or []] or [("", run.host_of(st), st.channel_stats)]
        for name, host, path in procs:
            text = files.text(path) if path else None
            if text is None:
                continue
            for line in text.splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                side = name or st.probe
                if e.get("role") == "producer":
                    rows.append(_row(st, e.get("channel", "?"), side, host, "producer", sent=e.get("sent"), bytes=e.get("bytes")))
                else:
                    rows.append(
                        _row(
                            st,
                            e.get("channel", "?"),
                            side,
                            host,
                            "consumer",
                            arrived=e.get("items_in"),
                            got=e.get("got"),
                            consumed=e.get("consumed"),
                            dropped_full=e.get("dropped_full"),
                            skipped=e.get("skipped"),
                            timeouts=e.get("get_timeouts"),
                            incomplete=e.get("incomplete"),
                            missing=e.get("missing"),
                        )
                    )
    return pl.DataFrame(rows, schema=SCHEMA) if rows else pl.DataFrame(schema=SCHEMA)
