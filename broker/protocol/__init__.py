"""The NSQ V2 wire protocol, sans I/O: nsqd 1.3.0's framing, checks and error strings.

Server side: :class:`ServerConnection` turns client bytes into command events
(:class:`Identify`, :class:`Pub`, ...) and frame encoders produce the replies.
Client side: :class:`FrameDecoder` and :func:`decode_message` read what a
server sends, and the ``encode_*`` functions write commands. Nothing here
imports trio or touches a socket.
"""

from .commands import (
    Auth,
    Cls,
    Command,
    Dpub,
    Fin,
    FinRun,
    Identify,
    Mpub,
    Nop,
    Pub,
    Publish,
    Rdy,
    Req,
    Sub,
    Touch,
    encode_auth,
    encode_cls,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_nop,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from .connection import LINE_TOO_LONG, ServerConnection, finish_identify
from .errors import ProtocolError, command_failed
from .frames import (
    BAD_PROTOCOL_FRAME,
    CLOSE_WAIT_FRAME,
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    MAGIC_V2,
    MAX_ATTEMPTS,
    MESSAGE_HEADER_LENGTH,
    MSG_ID_LENGTH,
    OK_FRAME,
    Frame,
    FrameDecoder,
    MessageFrame,
    decode_message,
    encode_error,
    encode_frame,
    encode_message_frame,
    encode_response,
    message_frame_header,
    pack_message_frame_header,
)
from .identify import IDENTIFY_FIELDS, decode_identify
from .lease import LEASE_IDENTIFY_FIELD, LEASE_OPS, Lease, encode_lease, is_valid_lease_token
from .limits import (
    DEFAULT_MAX_BODY_SIZE,
    DEFAULT_MAX_MSG_SIZE,
    DEFAULT_MAX_RDY_COUNT,
    DEFAULT_MAX_REQ_TIMEOUT_MS,
    LINE_BUFFER_SIZE,
    Limits,
)
from .names import go_quote, is_ephemeral, is_valid_name
from .state import State

__all__ = [
    "MAGIC_V2", "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE", "MSG_ID_LENGTH",
    "MESSAGE_HEADER_LENGTH", "DEFAULT_MAX_FRAME_SIZE", "MAX_ATTEMPTS",
    "ProtocolError", "command_failed", "LINE_TOO_LONG",
    "is_valid_name", "is_ephemeral", "go_quote",
    "encode_frame", "encode_response", "encode_error", "encode_message_frame", "message_frame_header",
    "pack_message_frame_header",
    "OK_FRAME", "CLOSE_WAIT_FRAME", "HEARTBEAT_FRAME", "BAD_PROTOCOL_FRAME",
    "Frame", "MessageFrame", "FrameDecoder", "decode_message",
    "encode_identify", "encode_auth", "encode_sub", "encode_pub", "encode_mpub", "encode_dpub",
    "encode_rdy", "encode_fin", "encode_req", "encode_touch", "encode_cls", "encode_nop",
    "Identify", "Auth", "Sub", "Pub", "Mpub", "Publish", "Dpub", "Rdy", "Fin", "FinRun", "Req", "Touch", "Cls", "Nop", "Command",
    "IDENTIFY_FIELDS", "decode_identify", "finish_identify",
    "Limits", "DEFAULT_MAX_MSG_SIZE", "DEFAULT_MAX_BODY_SIZE", "DEFAULT_MAX_RDY_COUNT",
    "DEFAULT_MAX_REQ_TIMEOUT_MS", "LINE_BUFFER_SIZE",
    "State", "ServerConnection",
    "Lease", "LEASE_OPS", "LEASE_IDENTIFY_FIELD", "encode_lease", "is_valid_lease_token",
]
