# Song or not: label 0 (not a Chinese vocal-synthesis song), 1 (original), 2 (cover/remix).
#
# Two implementations behind one protocol. `HttpClassifier` speaks the reference's service
# contract (`POST /classify {title, description, tags, aid}` → `{label, probabilities}`,
# `GET /health`, 30 s timeout), so the reference's model (Akari "3.17") or any compatible service
# plugs in; any failure is `ClassifierUnavailable`, which the pipeline treats as "retry later",
# never as a label. The default, `RuleClassifier`, needs no model download: a pure function of the
# three text channels that looks for vocal-synth singers and engines, and for original/cover
# markers, title first.
#
# Limits of the rules (also in docs/how-to/tracker.md): they read words, not audio. A song whose
# title, tags and description name no singer, engine or song marker is missed (label 0); a
# video *about* a song (a reaction, a tutorial, a hand-drawn PV) that uses song words may be
# counted as a song.
# Foreign voicebanks (初音未来, GUMI, ...) count only with a Chinese marker (中文, 中V, 填词),
# as the reference asks for Chinese vocal synthesis; the language of the lyrics is otherwise
# unknown. AI voice conversion (RVC, so-vits, "AI翻唱") is excluded, as the reference's
# labelling rules say, but only when it is labelled as such. Where unsure between song and
# not-song with a vocal-synth signal present, the rules say song, as the reference's labelling
# guide does ("if unsure, answer yes").
from __future__ import annotations

import re
from typing import Protocol

import httpx
import msgspec

from daemon.net import tls
from daemon.redact import cap, redact_url

RULES_VERSION = "rules-1"
REFERENCE_MODEL_VERSION = "3.17"
"""The version stored for an HTTP classifier that does not name its own."""
TIMEOUT = 30.0

NOT_SONG, ORIGINAL, COVER = 0, 1, 2


class Classification(msgspec.Struct, frozen=True):
    label: int
    """0 not a song, 1 original, 2 cover/remix."""
    probabilities: list[float]
    model_version: str


class ClassifierUnavailable(Exception):
    """The classifier service is down or gave no usable answer: try again later."""


class Classifier(Protocol):
    async def classify(
        self, aid: int, title: str, description: str, tags: list[str]
    ) -> Classification: ...

    async def health(self) -> bool: ...


# ---- rules (pure) -----------------------------------------------------------------------------

CHINESE_SINGERS = (
    "洛天依", "言和", "乐正绫", "乐正龙牙", "徵羽摩柯", "墨清弦", "星尘", "心华", "赤羽", "诗岸",
    "苍穹", "海伊", "永夜", "章楚楚", "牧心", "嫣汐", "夏语遥", "东方栀子", "绮萱", "小叶子",
    "起礼", "起复", "艾可", "幻晓", "Stardust", "Luo Tianyi", "Yuezheng Ling", "Yanhe",
)  # fmt: skip
FOREIGN_SINGERS = (
    "初音未来", "初音ミク", "miku", "镜音", "巡音", "gumi", "重音teto", "重音テト", "可不",
    "kafu", "flower", "ia", "结月缘",
)  # fmt: skip
ENGINES = (
    "vocaloid", "utau", "synthv", "synthesizer v", "diffsinger", "cevio", "ace虚拟歌姬",
    "ace studio", "虚拟歌手", "虚拟歌姬", "中v", "v家", "术力口", "调教", "vocal synth",
)  # fmt: skip
CHINESE_MARKERS = ("中文", "中v", "国v", "填词", "华语", "国语")
ORIGINAL_MARKERS = (
    "原创", "原创曲", "原创歌曲", "作词", "作曲", "编曲", "original", "オリジナル", "新曲",
)  # fmt: skip
COVER_MARKERS = (
    "翻唱", "cover", "remix", "翻调", "改编", "重制", "翻填", "原曲", "钢琴版", "arrange",
    "混音版", "中文填词",
)  # fmt: skip
SONG_WORDS = ("歌", "曲", "pv", "mv", "feat", "ft.", "song", "演唱", "唱")
NOT_SONG_MARKERS = (
    "mmd", "教程", "开箱", "直播", "回放", "实况", "杂谈", "手办", "周边", "模型", "绘画",
    "生日会", "抽奖", "鬼畜", "游戏", "测评", "vlog", "cos", "手书",
)  # fmt: skip
AI_CONVERSION = ("rvc", "so-vits", "sovits", "ai翻唱", "ai 翻唱", "ai cover", "ai孙燕姿")

_WEIGHTS = {"title": 3, "tags": 2, "description": 1}


def _term_pattern(terms: tuple[str, ...]) -> re.Pattern[str]:
    parts = []
    for term in terms:
        escaped = re.escape(term)
        # ASCII words must stand alone ("ia" is not in "media"); Chinese terms match inside text
        parts.append(rf"(?<![a-z0-9]){escaped}(?![a-z0-9])" if term.isascii() else escaped)
    return re.compile("|".join(parts))


_CHINESE_SINGERS = _term_pattern(tuple(s.lower() for s in CHINESE_SINGERS))
_FOREIGN_SINGERS = _term_pattern(FOREIGN_SINGERS)
_ENGINES = _term_pattern(ENGINES)
_CHINESE = _term_pattern(CHINESE_MARKERS)
_ORIGINAL = _term_pattern(ORIGINAL_MARKERS)
_COVER = _term_pattern(COVER_MARKERS)
_SONG = _term_pattern(SONG_WORDS)
_NOT_SONG = _term_pattern(NOT_SONG_MARKERS)
_AI = _term_pattern(AI_CONVERSION)


def _probabilities(label: int, confidence: float) -> list[float]:
    rest = round((1 - confidence) / 2, 4)
    probs = [rest, rest, rest]
    probs[label] = round(confidence, 4)
    return probs


def classify_by_rules(title: str, description: str, tags: list[str]) -> Classification:
    """The built-in label for a video's three text channels (see the module comment)."""
    channels = {
        "title": title.strip().lower(),
        "tags": ",".join(t.strip() for t in tags).lower(),
        "description": description.strip().lower()[:2000],
    }
    text = " ".join(channels.values())

    def score(pattern: re.Pattern[str]) -> int:
        return sum(w for name, w in _WEIGHTS.items() if pattern.search(channels[name]))

    if _AI.search(text):
        return Classification(NOT_SONG, _probabilities(NOT_SONG, 0.8), RULES_VERSION)
    synth = bool(_CHINESE_SINGERS.search(text) or _ENGINES.search(text)) or bool(
        _FOREIGN_SINGERS.search(text) and _CHINESE.search(text)
    )
    original, cover, song = score(_ORIGINAL), score(_COVER), score(_SONG)
    not_song = score(_NOT_SONG)
    if not synth:
        return Classification(NOT_SONG, _probabilities(NOT_SONG, 0.7), RULES_VERSION)
    marked = original + cover
    # a song marker in the title wins; else a non-song marker in the title, or more non-song
    # than song markers elsewhere, means not a song
    title_marked = bool(_ORIGINAL.search(channels["title"]) or _COVER.search(channels["title"]))
    if not title_marked and not_song and (not_song >= 3 or not_song > marked):
        return Classification(NOT_SONG, _probabilities(NOT_SONG, 0.7), RULES_VERSION)
    if cover >= original and cover > 0:
        return Classification(
            COVER, _probabilities(COVER, 0.9 if cover >= 3 else 0.7), RULES_VERSION
        )
    if original > 0:
        return Classification(
            ORIGINAL, _probabilities(ORIGINAL, 0.9 if original >= 3 else 0.7), RULES_VERSION
        )
    # a vocal-synth video with only generic song words, or none: "if unsure, answer yes"
    confidence = 0.6 if song else 0.5
    return Classification(ORIGINAL, _probabilities(ORIGINAL, confidence), RULES_VERSION)


class RuleClassifier:
    """The built-in classifier: `classify_by_rules`, always available."""

    async def classify(
        self, aid: int, title: str, description: str, tags: list[str]
    ) -> Classification:
        return classify_by_rules(title, description, tags)

    async def health(self) -> bool:
        return True


# ---- HTTP service -----------------------------------------------------------------------------


class _Answer(msgspec.Struct):
    label: int
    probabilities: list[float] = []
    model_version: str | None = None


class _Health(msgspec.Struct):
    status: str = ""


_answer = msgspec.json.Decoder(_Answer)
_health = msgspec.json.Decoder(_Health)


def classify_request(aid: int, title: str, description: str, tags: list[str]) -> dict[str, object]:
    """The body of `POST /classify`, with the reference's defaults for empty channels."""
    joined = ",".join(t.strip() for t in tags if t.strip())
    return {
        "title": title.strip() or "untitled",
        "description": description.strip() or "N/A",
        "tags": joined or "empty",
        "aid": aid,
    }


class HttpClassifier:
    """A classifier service with the reference's contract at `base_url`."""

    def __init__(
        self,
        base_url: str,
        http: httpx.AsyncClient | None = None,
        *,
        model_version: str = REFERENCE_MODEL_VERSION,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = http or httpx.AsyncClient(verify=tls.verifying())
        self.model_version = model_version
        """Stored with each label unless the service's answer names its own `model_version`."""

    async def classify(
        self, aid: int, title: str, description: str, tags: list[str]
    ) -> Classification:
        url = f"{self.base_url}/classify"
        try:
            response = await self.http.post(
                url, json=classify_request(aid, title, description, tags), timeout=TIMEOUT
            )
        except httpx.HTTPError as exc:
            raise ClassifierUnavailable(
                f"classifier at {redact_url(self.base_url)} unreachable: {type(exc).__name__}"
            ) from exc
        if response.status_code != 200:
            raise ClassifierUnavailable(
                f"classifier answered HTTP {response.status_code}: {cap(response.text, 200)}"
            )
        try:
            answer = _answer.decode(response.content)
        except msgspec.DecodeError as exc:
            raise ClassifierUnavailable(f"classifier answered an unexpected shape: {exc}") from None
        if answer.label not in (NOT_SONG, ORIGINAL, COVER):
            raise ClassifierUnavailable(f"classifier answered label {answer.label}")
        return Classification(
            answer.label, answer.probabilities, answer.model_version or self.model_version
        )

    async def health(self) -> bool:
        """Whether the service answers `/health` with status "healthy" (never raises)."""
        try:
            response = await self.http.get(f"{self.base_url}/health", timeout=TIMEOUT)
            return response.status_code == 200 and _health.decode(response.content).status == (
                "healthy"
            )
        except (httpx.HTTPError, msgspec.DecodeError):
            return False


def make_classifier(
    classifier_url: str | None, http: httpx.AsyncClient | None = None
) -> Classifier:
    """The HTTP classifier at `classifier_url`, or the built-in rules when it is unset."""
    if classifier_url is None:
        return RuleClassifier()
    return HttpClassifier(classifier_url, http)
