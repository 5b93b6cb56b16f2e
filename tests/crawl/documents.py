"""Documents made by the tests with known text: scanned PDFs and images (Pillow draws the text),
and minimal office files (zip archives of the least XML each format needs)."""

from __future__ import annotations

import io
import zipfile
from typing import Any
from xml.sax.saxutils import escape

from PIL import Image, ImageDraw, ImageFont


def text_image(lines: list[str], size: int = 40, width: int = 1275, height: int = 1650) -> Any:
    """A white page (150 dpi letter by default) with `lines` in black."""
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=size)
    for i, line in enumerate(lines):
        draw.text((100, 150 + i * size * 2), line, font=font, fill=0)
    return image


def image_bytes(lines: list[str], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    text_image(lines, width=1400, height=150 + len(lines) * 80 + 100).save(out, fmt)
    return out.getvalue()


def scanned_pdf(pages: list[list[str]]) -> bytes:
    """An image-only PDF (no text layer): page i shows the lines pages[i]."""
    images = [text_image(lines) for lines in pages]
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=150, save_all=True, append_images=images[1:])
    return out.getvalue()


def _zip(files: dict[str, str], stored_first: str | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        if stored_first is not None:
            archive.writestr(stored_first, files.pop(stored_first), zipfile.ZIP_STORED)
        for name, text in files.items():
            archive.writestr(name, text)
    return out.getvalue()


_CT = "http://schemas.openxmlformats.org/package/2006/content-types"
_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
_OFFICE_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_OOXML = "application/vnd.openxmlformats-officedocument"


def _types(overrides: dict[str, str]) -> str:
    parts = "".join(f'<Override PartName="{p}" ContentType="{t}"/>' for p, t in overrides.items())
    return (
        f'<?xml version="1.0"?><Types xmlns="{_CT}"><Default Extension="rels" '
        f'ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        f'<Default Extension="xml" ContentType="application/xml"/>{parts}</Types>'
    )


def _rels(targets: list[tuple[str, str]]) -> str:
    items = "".join(
        f'<Relationship Id="rId{i}" Type="{_OFFICE_REL}/{kind}" Target="{target}"/>'
        for i, (kind, target) in enumerate(targets, 1)
    )
    return f'<?xml version="1.0"?><Relationships xmlns="{_REL}">{items}</Relationships>'


def docx(paragraphs: list[str], table: list[list[str]] | None = None) -> bytes:
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'

    def para(text: str) -> str:
        return f"<w:p><w:r><w:t>{escape(text)}</w:t></w:r></w:p>"

    body = "".join(para(p) for p in paragraphs)
    if table:
        rows = "".join(
            "<w:tr>" + "".join(f"<w:tc>{para(c)}</w:tc>" for c in row) + "</w:tr>" for row in table
        )
        body += f"<w:tbl>{rows}</w:tbl>"
    return _zip({
        "[Content_Types].xml": _types({"/word/document.xml": f"{_OOXML}.wordprocessingml.document.main+xml"}),
        "_rels/.rels": _rels([("officeDocument", "word/document.xml")]),
        "word/document.xml": f'<?xml version="1.0"?><w:document {w}><w:body>{body}</w:body></w:document>',
    })  # fmt: skip


def xlsx(sheets: dict[str, list[list[str]]]) -> bytes:
    ns = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
    r = f'xmlns:r="{_OFFICE_REL}"'
    names = list(sheets)
    files = {
        "[Content_Types].xml": _types(
            {"/xl/workbook.xml": f"{_OOXML}.spreadsheetml.sheet.main+xml"}
            | {f"/xl/worksheets/sheet{i}.xml": f"{_OOXML}.spreadsheetml.worksheet+xml"
               for i in range(1, len(names) + 1)}
        ),
        "_rels/.rels": _rels([("officeDocument", "xl/workbook.xml")]),
        "xl/workbook.xml": f'<?xml version="1.0"?><workbook {ns} {r}><sheets>' + "".join(
            f'<sheet name="{escape(n)}" sheetId="{i}" r:id="rId{i}"/>'
            for i, n in enumerate(names, 1)) + "</sheets></workbook>",
        "xl/_rels/workbook.xml.rels": _rels(
            [("worksheet", f"worksheets/sheet{i}.xml") for i in range(1, len(names) + 1)]
        ),
    }  # fmt: skip
    for i, name in enumerate(names, 1):
        rows = "".join(
            f'<row r="{y}">' + "".join(
                f'<c r="{chr(65 + x)}{y}" t="inlineStr"><is><t>{escape(v)}</t></is></c>'
                for x, v in enumerate(row)) + "</row>"
            for y, row in enumerate(sheets[name], 1)
        )  # fmt: skip
        files[f"xl/worksheets/sheet{i}.xml"] = (
            f'<?xml version="1.0"?><worksheet {ns}><sheetData>{rows}</sheetData></worksheet>'
        )
    return _zip(files)


def pptx(slides: list[tuple[str, str]]) -> bytes:
    """Slides of (text, speaker notes) in order."""
    p = 'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
    a = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
    r = f'xmlns:r="{_OFFICE_REL}"'

    def shape_tree(text: str) -> str:
        return (f"<p:cSld><p:spTree><p:sp><p:txBody><a:p><a:r><a:t>{escape(text)}</a:t></a:r>"
                "</a:p></p:txBody></p:sp></p:spTree></p:cSld>")  # fmt: skip

    n = len(slides)
    files = {
        "[Content_Types].xml": _types(
            {"/ppt/presentation.xml": f"{_OOXML}.presentationml.presentation.main+xml"}
            | {f"/ppt/slides/slide{i}.xml": f"{_OOXML}.presentationml.slide+xml"
               for i in range(1, n + 1)}
            | {f"/ppt/notesSlides/notesSlide{i}.xml": f"{_OOXML}.presentationml.notesSlide+xml"
               for i in range(1, n + 1)}
        ),
        "_rels/.rels": _rels([("officeDocument", "ppt/presentation.xml")]),
        "ppt/presentation.xml": f'<?xml version="1.0"?><p:presentation {p} {r}><p:sldIdLst>'
        + "".join(f'<p:sldId id="{255 + i}" r:id="rId{i}"/>' for i in range(1, n + 1))
        + "</p:sldIdLst></p:presentation>",
        "ppt/_rels/presentation.xml.rels": _rels(
            [("slide", f"slides/slide{i}.xml") for i in range(1, n + 1)]
        ),
    }  # fmt: skip
    for i, (text, notes) in enumerate(slides, 1):
        files[f"ppt/slides/slide{i}.xml"] = (
            f'<?xml version="1.0"?><p:sld {p} {a} {r}>{shape_tree(text)}</p:sld>'
        )
        files[f"ppt/slides/_rels/slide{i}.xml.rels"] = _rels(
            [("notesSlide", f"../notesSlides/notesSlide{i}.xml")]
        )
        files[f"ppt/notesSlides/notesSlide{i}.xml"] = (
            f'<?xml version="1.0"?><p:notes {p} {a} {r}>{shape_tree(notes)}</p:notes>'
        )
    return _zip(files)


def odt(paragraphs: list[str]) -> bytes:
    office = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
    text = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
    body = "".join(f"<text:p>{escape(p)}</text:p>" for p in paragraphs)
    manifest = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"
    return _zip({
        "mimetype": "application/vnd.oasis.opendocument.text",
        "META-INF/manifest.xml": f'<?xml version="1.0"?><manifest:manifest xmlns:manifest="{manifest}">'
        '<manifest:file-entry manifest:full-path="/" manifest:media-type="application/vnd.oasis.opendocument.text"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>",
        "content.xml": f'<?xml version="1.0"?><office:document-content xmlns:office="{office}" '
        f'xmlns:text="{text}" office:version="1.2"><office:body><office:text>{body}'
        "</office:text></office:body></office:document-content>",
    }, stored_first="mimetype")  # fmt: skip


def epub(title: str, chapters: list[str]) -> bytes:
    items = "".join(
        f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>'
        for i in range(len(chapters))
    )
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
    files = {
        "mimetype": "application/epub+zip",
        "META-INF/container.xml": '<?xml version="1.0"?><container version="1.0" '
        'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile '
        'full-path="content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>',
        "content.opf": '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" '
        'version="3.0" unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
        f'<dc:identifier id="id">test</dc:identifier><dc:title>{escape(title)}</dc:title>'
        f"<dc:language>en</dc:language></metadata><manifest>{items}</manifest>"
        f"<spine>{spine}</spine></package>",
    }  # fmt: skip
    for i, chapter in enumerate(chapters):
        files[f"c{i}.xhtml"] = (
            '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>c'
            f"</title></head><body><p>{escape(chapter)}</p></body></html>"
        )
    return _zip(files, stored_first="mimetype")


def rtf(paragraphs: list[str]) -> bytes:
    return ("{\\rtf1\\ansi " + "".join(f"{p}\\par " for p in paragraphs) + "}").encode()


def _odf(mime: str, body: str) -> bytes:
    office = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
    manifest = "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0"
    spaces = (f'xmlns:office="{office}" xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
              'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
              'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
              'xmlns:presentation="urn:oasis:names:tc:opendocument:xmlns:presentation:1.0"')  # fmt: skip
    return _zip({
        "mimetype": mime,
        "META-INF/manifest.xml": f'<?xml version="1.0"?><manifest:manifest xmlns:manifest="{manifest}">'
        f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{mime}"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
        "</manifest:manifest>",
        "content.xml": f'<?xml version="1.0"?><office:document-content {spaces} office:version="1.2">'
        f"<office:body>{body}</office:body></office:document-content>",
    }, stored_first="mimetype")  # fmt: skip


def ods(sheets: dict[str, list[list[str]]]) -> bytes:
    tables = "".join(
        f'<table:table table:name="{escape(name)}">' + "".join(
            "<table:table-row>" + "".join(
                f'<table:table-cell office:value-type="string"><text:p>{escape(v)}</text:p>'
                "</table:table-cell>" for v in row) + "</table:table-row>"
            for row in rows) + "</table:table>"
        for name, rows in sheets.items()
    )  # fmt: skip
    return _odf("application/vnd.oasis.opendocument.spreadsheet",
                f"<office:spreadsheet>{tables}</office:spreadsheet>")  # fmt: skip


def odp(slides: list[str]) -> bytes:
    pages = "".join(
        f'<draw:page draw:name="s{i}"><draw:frame><draw:text-box><text:p>{escape(text)}</text:p>'
        "</draw:text-box></draw:frame></draw:page>"
        for i, text in enumerate(slides, 1)
    )
    return _odf("application/vnd.oasis.opendocument.presentation",
                f"<office:presentation>{pages}</office:presentation>")  # fmt: skip
