# A loopback SMTP relay for tests: the few commands smtplib speaks to a submission server (EHLO,
# AUTH PLAIN/LOGIN, MAIL, RCPT, DATA, RSET, NOOP, QUIT), no TLS, every accepted message kept with
# its envelope and parsed. It is a real server on a real socket, so the sender's session, its
# timeouts and its failures are exercised as they are against a relay. Faults are scripted: the
# next N transactions are refused with a reply code (451: try later, 550: never).
from __future__ import annotations

import base64
import email
import email.policy
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from email.message import EmailMessage

import trio


@dataclass
class Mail:
    """One accepted message."""

    sender: str
    recipients: list[str]
    data: bytes
    login: str | None

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed

    @property
    def text(self) -> str:
        body = self.message.get_body(("plain",))
        return "" if body is None else str(body.get_content())


@dataclass
class FakeSmtp:
    """The relay's state: accepted mails, the credentials it takes, scripted refusals."""

    username: str | None = None
    password: str | None = None
    mails: list[Mail] = field(default_factory=list)
    refused: int = 0
    """Transactions refused so far (by the script)."""
    port: int = 0
    _fail: list[int] = field(default_factory=list)
    _arrived: trio.Event = field(default_factory=trio.Event)

    def fail_next(self, count: int = 1, code: int = 451) -> None:
        """Refuse the next `count` transactions at MAIL FROM with `code`."""
        self._fail += [code] * count

    async def wait_mails(self, count: int) -> list[Mail]:
        while len(self.mails) < count:
            await self._arrived.wait()
        return self.mails

    def _keep(self, mail: Mail) -> None:
        self.mails.append(mail)
        self._arrived.set()
        self._arrived = trio.Event()

    async def _session(self, stream: trio.SocketStream) -> None:
        lines = _Lines(stream)

        async def say(text: str) -> None:
            await stream.send_all(text.encode() + b"\r\n")

        await say("220 fake-smtp ready")
        sender: str | None = None
        recipients: list[str] = []
        login: str | None = None
        while (line := await lines.next()) is not None:
            verb, _, rest = line.decode("utf-8", "replace").partition(" ")
            verb = verb.upper()
            if verb == "EHLO":
                await say("250-fake-smtp\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME")
            elif verb == "HELO":
                await say("250 fake-smtp")
            elif verb == "AUTH":
                login = await self._auth(rest, lines, say)
            elif verb == "MAIL":
                if self.username is not None and login is None:
                    await say("530 authentication required")
                elif self._fail:
                    self.refused += 1
                    await say(f"{self._fail.pop(0)} scripted refusal")
                else:
                    sender, recipients = rest.partition(":")[2].strip(" <>"), []
                    await say("250 ok")
            elif verb == "RCPT" and sender is not None:
                recipients.append(rest.partition(":")[2].strip(" <>"))
                await say("250 ok")
            elif verb == "DATA" and sender is not None and recipients:
                await say("354 end with <CRLF>.<CRLF>")
                data = await lines.data()
                if data is None:
                    return
                self._keep(Mail(sender, recipients, data, login))
                sender, recipients = None, []
                await say("250 queued")
            elif verb in ("RSET", "NOOP"):
                sender, recipients = (None, []) if verb == "RSET" else (sender, recipients)
                await say("250 ok")
            elif verb == "QUIT":
                await say("221 bye")
                return
            else:
                await say("503 bad sequence of commands")

    async def _auth(self, rest: str, lines: _Lines, send: Callable[[str], Awaitable[None]]
                    ) -> str | None:  # fmt: skip
        mechanism, _, initial = rest.partition(" ")
        if mechanism.upper() == "PLAIN":
            if not initial:
                await send("334 ")
                initial = ((await lines.next()) or b"").decode()
            parts = base64.b64decode(initial).split(b"\0")
            user, secret = parts[-2].decode(), parts[-1].decode()
        elif mechanism.upper() == "LOGIN":
            await send("334 VXNlcm5hbWU6")
            user = base64.b64decode((await lines.next()) or b"").decode()
            await send("334 UGFzc3dvcmQ6")
            secret = base64.b64decode((await lines.next()) or b"").decode()
        else:
            await send("504 unknown mechanism")
            return None
        if (user, secret) != (self.username, self.password):
            await send("535 authentication failed")
            return None
        await send("235 authenticated")
        return user


class _Lines:
    """CRLF lines from a stream, and a DATA section up to its lone dot."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> bytes | None:
        while b"\r\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    async def data(self) -> bytes | None:
        out: list[bytes] = []
        while (line := await self.next()) is not None:
            if line == b".":
                return b"\r\n".join(out) + b"\r\n"
            out.append(line[1:] if line.startswith(b"..") else line)
        return None


@asynccontextmanager
async def open_smtp(username: str | None = None, password: str | None = None
                    ) -> AsyncIterator[FakeSmtp]:  # fmt: skip
    """A FakeSmtp listening on 127.0.0.1 (its `port` set) until the block ends."""
    server = FakeSmtp(username=username, password=password)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await server._session(stream)

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1")
        listeners = await nursery.start(serve)
        server.port = listeners[0].socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()
