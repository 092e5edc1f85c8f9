"""Exactly-once point-to-point channels (I6): the one place that lists this package's public API.

Layers: `wire` (frame kinds on the transport's stamped, checksummed header; receive slots) and `log`
(the receiver's consumption log) are pure formats; `receiver` (ChannelListener, ChannelReceiver, Message)
and `sender` (Channel) move messages and recover. `p2pgen_lab.rigs.channels` runs them as real processes for
the fault tests and `p2pgen bench channel`.

Contract: a message counts as done only when the receiving application called `Message.consumed()`;
the sender's own completion never does. `naive` and `batched` modes trust completion instead, and exist
only to be measured against (`p2pgen bench channel`).
"""

from p2pgen.channel.config import BATCHED, EXACTLY_ONCE, MODES, NAIVE, ChannelConfig
from p2pgen.channel.log import ConsumedSet, ConsumptionLog, LogBusy, channel_path, scan
from p2pgen.channel.receiver import ChannelListener, ChannelReceiver, Message
from p2pgen.channel.sender import Channel
from p2pgen.transport.group import Endpoint

__all__ = ["BATCHED", "Channel", "ChannelConfig", "ChannelListener", "ChannelReceiver", "ConsumedSet",
           "ConsumptionLog", "EXACTLY_ONCE", "Endpoint", "LogBusy", "MODES", "Message", "NAIVE",
           "channel_path", "scan"]
