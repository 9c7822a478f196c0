"""PDF files for tests, written on the spot: pages from images (Pillow's PDF writer), and the
PDFs a user must get one clear line for: no pages, encrypted, corrupt."""

from __future__ import annotations

from pathlib import Path


def pdf_of_images(path: Path, images) -> Path:
    rgb = [im.convert("RGB") for im in images]
    rgb[0].save(path, save_all=True, append_images=rgb[1:])
    return path


def _write_pdf(path: Path, objects: list[bytes], trailer: bytes = b"") -> Path:
    """A minimal PDF with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    path.write_bytes(bytes(out))
    return path


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
NO_PAGES = b"<< /Type /Pages /Kids [] /Count 0 >>"


def pdf_without_pages(path: Path) -> Path:
    return _write_pdf(path, [CATALOG, NO_PAGES])


def encrypted_pdf(path: Path) -> Path:
    """The standard security handler (RC4, revision 2) with a user password that is not
    empty, so a reader without the password cannot open it."""
    encrypt = (b"<< /Filter /Standard /V 1 /R 2 /O <" + b"11" * 32 + b"> /U <" + b"22" * 32
               + b"> /P -4 >>")
    file_id = b"<00112233445566778899aabbccddeeff>"
    return _write_pdf(path, [CATALOG, NO_PAGES, encrypt], b" /Encrypt 3 0 R /ID [%s %s]" % (file_id, file_id))


def corrupt_pdf(path: Path) -> Path:
    path.write_bytes(b"%PDF-1.4\nthis is not really a PDF\n%%EOF\n")
    return path
