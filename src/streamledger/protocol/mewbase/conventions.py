"""Every choice the mewbase wire-protocol draft leaves open, in one place.

The draft (``specs/mewbase.md``, from mewbase's ``wire_protocol.md``) fixes the frames and their
fields but not several things a client has to decide. A real server may overrule any of these; change
them here and nowhere else. docs/mewbase.md lists the same choices for readers.

1. **Limits.** A frame is accepted up to :data:`DEFAULT_MAX_FRAME_SIZE` (16 MiB, MongoDB's document
   limit); the draft only says "X megabytes". Configurable per connection.
2. **CONNECT** carries ``version`` = :data:`PROTOCOL_VERSION` (the draft's example value) and no rID;
   the first RESPONSE after it answers it, whatever its rID (or none).
3. **Integer widths.** rID, sessID, subID and queryID are int32 (the reference server reads them as
   Java ``Integer``); startPos, startTimestamp, pos and timestamp are int64. rIDs count up from 1 per
   connection and never repeat within it.
4. **Timestamps** are milliseconds since the Unix epoch (the reference server stores
   ``System.currentTimeMillis()`` when it persists an event).
5. **ACKEV** also carries ``pos`` (:data:`ACKEV_POS`): the draft's "acknowledge the last event received"
   is ambiguous while the server streams ahead of the client, and later mewbase servers added the same
   field. The acknowledgement covers every event up to and including ``pos``.
6. **Durable subscriptions** live where the reference server keeps them: the system binder
   :data:`DURABLE_SUBS_BINDER`, one document per durableID with the acknowledged position in
   :data:`LAST_ACKED_FIELD`. A durable SUBSCRIBE whose durableID has an acknowledged position resumes
   after it (startPos/startTimestamp are then ignored); UNSUBSCRIBE deletes the durable subscription,
   SUBCLOSE keeps it. The durableID of (channel, reference) is :func:`durable_id`.
7. **Channel statistics.** The draft has no way to learn a channel's first or last position. The
   system binder :data:`CHANNELS_BINDER` (one document per channel, ``id`` = name, as in the reference
   server) may carry :data:`FIRST_POS_FIELD`, :data:`LAST_POS_FIELD`, :data:`LAST_TIMESTAMP_FIELD` and
   :data:`COUNT_FIELD`; when they are absent the client scans the channel instead (slower, same result).
8. **QUERYRESPONSE** is ``{queryID, ok, errCode?, errMsg?, numResults?}``; ``numResults: 0`` ends the
   query without QUERYRESULT frames. Otherwise results follow until one has ``last: true``.
9. **Matchers** (SUBSCRIBE and QUERY): a document matches when every matcher field equals the same
   top-level field of the document; an empty matcher matches everything.
10. **Error codes** are the strings ``ERR_*`` below; numeric codes of later mewbase servers are mapped
    onto them by :func:`normalise_error_code`.
11. **Transactions.** Inside a transaction a PUBLISH's RESPONSE means "staged"; COMMITTX's RESPONSE is
    the confirm that every staged event is persisted (in order, atomically); ABORTTX drops them.
12. **URLs** are ``mewbase://[user:pass@]host:port``; the draft names no default port, so the port is
    required.
"""

from __future__ import annotations

PROTOCOL_VERSION = "1.0"
URL_SCHEME = "mewbase"
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
MIN_FRAME_SIZE = 5  # int32 length + the terminating 0x00 of an empty document

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# -- system binders (choices 6 and 7) ---------------------------------------------------------------
DURABLE_SUBS_BINDER = "_mb.durableSubs"
CHANNELS_BINDER = "_mb.channels"
ID_FIELD = "id"
LAST_ACKED_FIELD = "lastAcked"
FIRST_POS_FIELD = "firstPos"
LAST_POS_FIELD = "lastPos"
LAST_TIMESTAMP_FIELD = "lastTimestamp"
COUNT_FIELD = "count"

# -- extra fields (choices 5 and 8) ----------------------------------------------------------------
ACKEV_POS = "pos"
QUERYRESPONSE_NUM_RESULTS = "numResults"

# -- error codes (choice 10) -----------------------------------------------------------------------
ERR_AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
ERR_UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
ERR_NOT_AUTHORISED = "NOT_AUTHORISED"
ERR_NOT_CONNECTED = "NOT_CONNECTED"
ERR_NO_SUCH_CHANNEL = "NO_SUCH_CHANNEL"
ERR_NO_SUCH_BINDER = "NO_SUCH_BINDER"
ERR_NO_SUCH_SUBSCRIPTION = "NO_SUCH_SUBSCRIPTION"
ERR_TX_IN_PROGRESS = "TX_IN_PROGRESS"
ERR_NO_TX = "NO_TX"
ERR_EVENT_TOO_LARGE = "EVENT_TOO_LARGE"
ERR_INVALID_FRAME = "INVALID_FRAME"
ERR_STORAGE_FAILED = "STORAGE_FAILED"
ERR_SERVER_ERROR = "SERVER_ERROR"

# Numeric codes of later mewbase servers (io.mewbase.client.Client constants).
_NUMERIC_CODES = {
    1: ERR_AUTHENTICATION_FAILED,
    2: ERR_NOT_AUTHORISED,
    3: ERR_NO_SUCH_CHANNEL,
    4: ERR_NO_SUCH_BINDER,
    100: ERR_SERVER_ERROR,
}


def normalise_error_code(code: object) -> str | None:
    """The errCode as a string; a known numeric code becomes its name, None stays None."""
    if code is None:
        return None
    if isinstance(code, int) and not isinstance(code, bool):
        return _NUMERIC_CODES.get(code, str(code))
    return str(code)


def durable_id(channel: str, reference: str) -> str:
    """The durableID under which ``reference`` keeps its position on ``channel`` (choice 6).

    durableIDs are global on the server, so the channel is part of the name; refusing ``/`` in channel
    names keeps the mapping one-to-one.
    """
    if not channel or "/" in channel:
        raise ValueError(f"channel name {channel!r} must be non-empty and contain no '/'")
    if not reference:
        raise ValueError("the reference (durable subscription name) must not be empty")
    return f"{channel}/{reference}"
