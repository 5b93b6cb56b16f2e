# The two ways a monitor notification leaves the daemon, both blocking (smtplib, Apprise), run by
# notifier.py in a worker thread under a timeout: an e-mail through the operator's SMTP relay
# ([monitors.smtp]), and a message to a named Apprise URL ([[monitors.notification_targets]]).
# Secrets (the relay's password, a target's URL, which often holds a token) are read once from
# the environment when the senders are built and stay in this object: an outcome says what
# happened in words of its own (an SMTP reply code, "the service did not accept it"), never a
# URL, and Apprise's own logger, which may print one, is kept out of crawld's logs.
from __future__ import annotations

import logging
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate

import msgspec

from daemon.config import ConfigError, resolve_secret
from daemon.crawl.monitors import notify
from daemon.crawl.monitors.config import MonitorConfig, SmtpConfig

_APPRISE_LOG = logging.getLogger("apprise")
_APPRISE_LOG.propagate = False
_APPRISE_LOG.addHandler(logging.NullHandler())


class Outcome(msgspec.Struct, frozen=True):
    """One attempt: `ok`, or `error` (safe to store and answer) and whether a retry may help."""

    ok: bool
    error: str | None = None
    retry: bool = True


SENT = Outcome(ok=True)


def _apprise_plugin(url: str, timeout: float) -> object | None:
    import apprise

    asset = apprise.AppriseAsset(storage_mode="memory")
    plugin = apprise.Apprise.instantiate(url, asset=asset)
    if plugin is None:
        return None
    plugin.socket_connect_timeout = timeout
    plugin.socket_read_timeout = timeout
    return plugin


class Senders:
    """The configured destinations, their secrets resolved (ConfigError naming the key path
    when one is missing or a target's URL is not one Apprise can send to)."""

    def __init__(self, config: MonitorConfig) -> None:
        self.timeout = float(config.notify_timeout)
        self.smtp: SmtpConfig | None = config.smtp
        self._password = None
        if config.smtp is not None:
            self._password = resolve_secret(
                config.smtp.password_env, "$.monitors.smtp.password_env"
            )
        self._urls: dict[str, str] = {}
        for i, target in enumerate(config.notification_targets):
            path = f"$.monitors.notification_targets[{i}]"
            url = target.url
            if target.url_env is not None:
                url = resolve_secret(target.url_env, f"{path}.url_env")
                path += ".url_env"
            else:
                path += ".url"
            if not url or _apprise_plugin(url, self.timeout) is None:
                raise ConfigError(
                    f"`{path}`: not a URL Apprise can send to (the value is not shown)"
                )
            self._urls[target.name] = url

    def names(self) -> list[str]:
        return sorted(self._urls)

    def send(self, channel: str, message: notify.Message, message_id: str) -> Outcome:
        """Deliver one message (blocking; call it in a worker thread)."""
        if channel == notify.EMAIL:
            if self.smtp is None:
                return Outcome(ok=False, error="no SMTP relay is configured ([monitors.smtp])",
                               retry=False)  # fmt: skip
            return send_email(self.smtp, self._password, message, message_id, self.timeout)
        name = channel.removeprefix(notify.TARGET_PREFIX)
        url = self._urls.get(name)
        if url is None:
            return Outcome(ok=False, error=f"no notification target named {name!r} is configured",
                           retry=False)  # fmt: skip
        return send_apprise(url, message, self.timeout)


def send_email(smtp: SmtpConfig, password: str | None, message: notify.Message,
               message_id: str, timeout: float) -> Outcome:  # fmt: skip
    """One SMTP session with the relay: TLS as configured, login when a user is set."""
    mail = EmailMessage()
    mail["Subject"] = message.subject
    mail["From"] = smtp.from_address
    mail["To"] = ", ".join(message.recipients)
    mail["Date"] = formatdate(localtime=False)
    mail["Message-ID"] = message_id
    mail.set_content(message.text)
    try:
        if smtp.security == "tls":
            session: smtplib.SMTP = smtplib.SMTP_SSL(
                smtp.host, smtp.port, timeout=timeout, context=ssl.create_default_context()
            )
        else:
            session = smtplib.SMTP(smtp.host, smtp.port, timeout=timeout)
        with session:
            if smtp.security == "starttls":
                session.starttls(context=ssl.create_default_context())
            if smtp.username is not None and password is not None:
                session.login(smtp.username, password)
            session.send_message(mail)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = sorted({code for code, _ in exc.recipients.values()})
        return Outcome(ok=False, error=f"the relay refused every recipient ({codes})",
                       retry=any(c < 500 for c in codes))  # fmt: skip
    except smtplib.SMTPResponseException as exc:
        text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) \
            else str(exc.smtp_error)  # fmt: skip
        return Outcome(ok=False, error=f"SMTP {exc.smtp_code}: {text[:200]}",
                       retry=exc.smtp_code < 500)  # fmt: skip
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        return Outcome(ok=False, error=f"could not talk to the relay: {type(exc).__name__}")
    return SENT


def send_apprise(url: str, message: notify.Message, timeout: float) -> Outcome:
    """One Apprise notification (plain text)."""
    import apprise

    plugin = _apprise_plugin(url, timeout)
    if plugin is None:
        return Outcome(ok=False, error="the target's URL is not one Apprise can send to",
                       retry=False)  # fmt: skip
    sender = apprise.Apprise(asset=apprise.AppriseAsset(storage_mode="memory"))
    sender.add(plugin)  # type: ignore[arg-type]
    try:
        ok = bool(sender.notify(title=message.subject, body=message.text,
                                body_format=apprise.NotifyFormat.TEXT))  # fmt: skip
    except Exception as exc:  # a plugin's bug must not end the deliverer
        return Outcome(ok=False, error=f"the notification failed: {type(exc).__name__}")
    return SENT if ok else Outcome(ok=False, error="the service did not accept the notification")
