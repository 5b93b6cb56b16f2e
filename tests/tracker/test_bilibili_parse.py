from __future__ import annotations

import json

import pytest

from daemon.tracker.bilibili import (
    BiliError,
    Stat,
    UpstreamError,
    bulk_resources,
    envelope_code,
    kept_tags,
    parse_bulk,
    parse_newlist,
    parse_view_detail,
    parse_view_stat,
)

# Shapes as Bilibili answers them (trimmed to a few of the many fields it sends).
NEWLIST = {
    "code": 0,
    "message": "0",
    "ttl": 1,
    "data": {
        "archives": [
            {"aid": 113900000000002, "bvid": "BV1xx", "tid": 30, "title": "b", "pubdate": 2},
            {"aid": 113900000000001, "bvid": "BV1yy", "tid": 30, "title": "a", "pubdate": 1},
        ],
        "page": {"count": 2, "num": 1, "size": 10},
    },
}

STAT = {"aid": 1, "view": 1234, "danmaku": 5, "reply": 6, "favorite": 7, "coin": 8,
        "share": 9, "now_rank": 0, "his_rank": 0, "like": 10, "dislike": 0}  # fmt: skip

VIEW = {
    "code": 0,
    "message": "0",
    "ttl": 1,
    "data": {"aid": 1, "bvid": "BV1GJ411x7h7", "title": "t", "stat": STAT, "tid": 30},
}

DETAIL = {
    "code": 0,
    "message": "0",
    "ttl": 1,
    "data": {
        "View": {
            "aid": 170001,
            "bvid": "BV17x411w7KC",
            "title": "【洛天依原创】星河",
            "desc": "作词：某人",
            "duration": 215,
            "pubdate": 1700000000,
            "ctime": 1699990000,
            "pic": "http://i0.hdslb.com/bfs/archive/x.jpg",
            "owner": {"mid": 42, "name": "up主", "face": "http://i0.hdslb.com/face.jpg"},
            "stat": STAT,
            "pages": [{"cid": 1, "page": 1}],
        },
        "Card": {
            "card": {"mid": "42", "name": "up主", "sign": "签名", "fans": 99},
            "follower": 1234,
            "following": False,
        },
        "Tags": [
            {"tag_id": 1, "tag_name": "洛天依", "tag_type": "old_channel"},
            {"tag_id": 2, "tag_name": "VOCALOID中文曲", "tag_type": "topic"},
            {"tag_id": 3, "tag_name": "星河 (BGM)", "tag_type": "bgm"},
            {"tag_id": 4, "tag_name": "洛天依", "tag_type": "topic"},
            {"tag_id": 5, "tag_name": "原创", "tag_type": "old_channel"},
        ],
        "Related": [],
    },
}

BULK = {
    "code": 0,
    "message": "0",
    "ttl": 1,
    "data": [
        {"id": 1, "bvid": "BV1", "attr": 0, "title": "x",
         "cnt_info": {"collect": 7, "play": 100, "thumb_up": 10, "share": 9, "reply": 6,
                      "danmaku": 5, "coin": 8, "vt": 0, "play_switch": 0}},
        {"id": 3, "bvid": "BV3", "attr": 0, "title": "y",
         "cnt_info": {"collect": 0, "play": 300, "thumb_up": 0, "share": 0, "reply": 0,
                      "danmaku": 0, "coin": 0}},
    ],
}  # fmt: skip


def enc(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def test_newlist_aids_newest_first() -> None:
    assert parse_newlist(enc(NEWLIST)) == [113900000000002, 113900000000001]


@pytest.mark.parametrize("data", [None, {"archives": []}, {"archives": None, "page": {"count": 0}}])
def test_newlist_empty_page(data: object) -> None:
    assert parse_newlist(enc({"code": 0, "message": "0", "ttl": 1, "data": data})) == []


def test_view_stat_mapping() -> None:
    assert parse_view_stat(enc(VIEW)) == Stat(
        views=1234, danmakus=5, replies=6, likes=10, coins=8, shares=9, favorites=7
    )


def test_view_detail_mapping() -> None:
    detail = parse_view_detail(enc(DETAIL))
    assert detail.aid == 170001
    assert detail.bvid == "BV17x411w7KC"
    assert detail.title == "【洛天依原创】星河"
    assert detail.description == "作词：某人"
    assert detail.duration == 215
    assert detail.published_ms == 1_700_000_000_000
    assert detail.cover_url.endswith("x.jpg")
    assert detail.uploader.uid == 42
    assert detail.uploader.name == "up主"
    assert detail.uploader.sign == "签名"
    assert detail.uploader.fans == 1234  # Card.follower, not Card.card.fans
    assert detail.tags == ["洛天依", "VOCALOID中文曲", "原创"]  # old_channel + topic, no bgm
    assert detail.stat.views == 1234


def test_view_detail_without_card_or_tags() -> None:
    data = {"View": DETAIL["data"]["View"]}  # type: ignore[index]
    detail = parse_view_detail(enc({"code": 0, "message": "0", "ttl": 1, "data": data}))
    assert detail.tags == []
    assert detail.uploader.fans == 0
    assert detail.uploader.sign == ""


@pytest.mark.parametrize(
    ("tags", "kept"),
    [
        ([], []),
        ([("a", "old_channel"), ("b", "topic"), ("c", "bgm")], ["a", "b"]),
        ([("a", ""), ("a", "topic"), ("  ", "old_channel")], ["a"]),
        ([("x", "new_channel"), (" y ", "old_channel")], ["y"]),
    ],
)
def test_kept_tags(tags: list[tuple[str, str]], kept: list[str]) -> None:
    assert kept_tags(tags) == kept


def test_bulk_mapping_and_missing_videos() -> None:
    stats = parse_bulk(enc(BULK))
    assert set(stats) == {1, 3}
    assert stats[1] == Stat(
        views=100, danmakus=5, replies=6, likes=10, coins=8, shares=9, favorites=7
    )
    assert stats[3].views == 300


@pytest.mark.parametrize("data", [None, []])
def test_bulk_nothing_found(data: object) -> None:
    assert parse_bulk(enc({"code": 0, "message": "0", "ttl": 1, "data": data})) == {}


@pytest.mark.parametrize(
    ("aids", "resources"),
    [([1], "1:2,"), ([1, 22, 333], "1:2,22:2,333:2,"), (list(range(50)), None)],
)
def test_bulk_resources(aids: list[int], resources: str | None) -> None:
    got = bulk_resources(aids)
    assert got.endswith(":2,")
    if resources is not None:
        assert got == resources


@pytest.mark.parametrize("count", [0, 51])
def test_bulk_resources_bounds(count: int) -> None:
    with pytest.raises(ValueError):
        bulk_resources(list(range(count)))


@pytest.mark.parametrize(
    ("code", "message", "gone", "limited"),
    [(-404, "啥都木有", True, False), (62002, "稿件不可见", True, False),
     (62012, "仅UP主自己可见", True, False), (-412, "请求被拦截", False, True),
     (-400, "请求错误", False, False)],
)  # fmt: skip
@pytest.mark.parametrize("parse", [parse_newlist, parse_view_stat, parse_view_detail, parse_bulk])
def test_nonzero_code_is_bili_error(
    parse: object, code: int, message: str, gone: bool, limited: bool
) -> None:
    body = enc({"code": code, "message": message, "ttl": 1, "data": None})
    with pytest.raises(BiliError) as caught:
        parse(body)  # type: ignore[operator]
    assert caught.value.code == code
    assert caught.value.message == message
    assert caught.value.video_gone is gone
    assert caught.value.rate_limited is limited


@pytest.mark.parametrize(
    "body",
    [b"", b"<html>502</html>", b"[]", b'{"message": "no code"}',
     enc({"code": 0, "message": "0", "data": {"stat": {"view": "many"}}})],
)  # fmt: skip
def test_unusable_answer_is_upstream_error(body: bytes) -> None:
    with pytest.raises(UpstreamError):
        parse_view_stat(body)


def test_envelope_code() -> None:
    assert envelope_code(enc({"code": -412, "message": "请求被拦截"})) == (-412, "请求被拦截")
    assert envelope_code(b"nope") is None
