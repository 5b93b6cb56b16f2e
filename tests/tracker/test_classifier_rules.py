from __future__ import annotations

import pytest

from daemon.tracker.classifier import (
    RULES_VERSION,
    RuleClassifier,
    classify_by_rules,
    classify_request,
    make_classifier,
)

CASES = [
    # (title, description, tags, label)
    ("【洛天依原创】星河", "作词：某人 作曲：某人", ["洛天依", "VOCALOID中文曲"], 1),
    ("【言和】霜雪千年（翻唱）", "", ["言和", "翻唱"], 2),
    ("【乐正绫】不夜城 cover", "", ["乐正绫"], 2),
    ("【洛天依 言和】归去来兮 remix", "", ["VOCALOID"], 2),
    ("【星尘原创曲】光", "PV付", [], 1),
    ("【SynthV】夏日 原创", "", ["Synthesizer V"], 1),
    ("【UTAU】雨后", "原曲：某曲", ["UTAU"], 2),
    ("Luo Tianyi - original song", "", [], 1),
    ("【洛天依】长安", "", ["洛天依"], 1),  # singer only: "if unsure, answer yes"
    ("【初音未来】千本樱", "", ["初音未来"], 0),  # a foreign voicebank, no Chinese marker
    ("【初音未来】中文填词 千本樱", "", ["初音未来"], 2),
    ("【初音ミク】星河 中文原创", "", ["初音ミク"], 1),
    ("【MMD】洛天依的日常", "", ["MMD", "3D"], 0),
    ("洛天依生日会 直播回放", "", ["直播"], 0),
    ("VOCALOID 调教教程 第3期", "", ["教程"], 0),
    ("【手书】星河", "原创PV", ["洛天依", "原创"], 0),  # a title non-song marker wins
    ("【洛天依原创】星河 手书PV", "", ["手书"], 1),  # unless the title says song
    ("【AI翻唱】洛天依 - 晴天", "RVC", ["AI"], 0),
    ("今天的晚饭", "", ["美食"], 0),
    ("周杰伦 晴天 翻唱", "", ["翻唱"], 0),  # a human cover: no vocal synth
    ("discover media", "", [], 0),  # "cover" and "ia" only as whole words
    ("", "", [], 0),
]


@pytest.mark.parametrize(("title", "description", "tags", "label"), CASES)
def test_rule_table(title: str, description: str, tags: list[str], label: int) -> None:
    got = classify_by_rules(title, description, tags)
    assert got.label == label
    assert got.model_version == RULES_VERSION
    assert len(got.probabilities) == 3
    assert got.probabilities.index(max(got.probabilities)) == label
    assert sum(got.probabilities) == pytest.approx(1, abs=1e-3)


def test_title_markers_are_more_certain_than_description_ones() -> None:
    strong = classify_by_rules("【洛天依原创】星河", "", [])
    weak = classify_by_rules("【洛天依】星河", "原创", [])
    assert strong.label == weak.label == 1
    assert strong.probabilities[1] > weak.probabilities[1]


def test_classify_request_uses_the_reference_defaults() -> None:
    assert classify_request(1, " ", "", [" ", ""]) == {
        "title": "untitled", "description": "N/A", "tags": "empty", "aid": 1,
    }  # fmt: skip
    assert classify_request(2, "t", "d", ["a", " b "])["tags"] == "a,b"


async def test_rule_classifier_is_the_default() -> None:
    classifier = make_classifier(None)
    assert isinstance(classifier, RuleClassifier)
    assert await classifier.health()
    got = await classifier.classify(1, "【言和】翻唱", "", [])
    assert got.label == 2
