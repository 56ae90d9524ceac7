"""What a sources block shows for a citation: the title once, then where in the document."""

from bot.types import Citation


def test_a_heading_path_that_repeats_the_title_shows_the_title_once():
    meta = {"doc_id": "m", "version": 1, "position": 0, "title": "Maintenance Schedule", "source": "m.md",
            "header": "Maintenance Schedule > Bearing lubrication"}
    assert Citation.of_chunk(1, meta).label == "Maintenance Schedule, Bearing lubrication"


def test_pages_and_plain_titles_keep_their_label():
    page = Citation.of_chunk(1, {"doc_id": "p", "version": 1, "position": 0, "title": "Pump Manual",
                                 "source": "pump.pdf", "page": 14})
    assert page.label == "Pump Manual, p. 14"
    plain = Citation.of_chunk(2, {"doc_id": "t", "version": 1, "position": 0, "title": "Notes", "source": "n.txt",
                                  "header": "Notes"})
    assert plain.label == "Notes"
