"""Generate examples/kb/service-contacts.pdf (Hengli Drives service process and contacts).

Run from the repository root:  uv run python examples/make_pdf.py
Uses only fpdf2 core fonts (Helvetica), so all text must be Latin-1.
"""

from datetime import UTC, datetime
from pathlib import Path

from fpdf import FPDF

OUT = Path(__file__).resolve().parent / "kb" / "service-contacts.pdf"

TITLE = "Hengli Drives Service Process and Contacts"

SECTIONS: list[tuple[str, list[str]]] = [
    (
        "",
        [
            "This document explains how to contact Hengli Drives after-sales service for HL-M200 and "
            "HL-M300 induction motors and HL-D50 variable frequency drives, what response times you can "
            "expect, and how to return a product for repair using the RMA (Return Material Authorization) process.",
        ],
    ),
    (
        "Service hotlines and email",
        [
            "China service hotline: +86 400-820-1234 (24 hours a day, 7 days a week, Mandarin and English).",
            "Europe service hotline: +44 20 7946 0123 (Monday to Friday, 08:00-18:00 CET, English and German).",
            "Service email: service@hengli-drives.example (all regions, answered within one working day).",
            "Spare parts orders: service@hengli-drives.example, subject line 'Spare parts' and the serial number.",
            "Please have the serial number from the nameplate ready (format HL-YYMM-NNNNN, for example "
            "HL-2403-01562), together with the product model, the HL-D50 fault code if any (E-001 to E-015), "
            "and your measured values such as supply voltage, motor current, temperature and vibration.",
        ],
    ),
    (
        "Response times",
        [
            "Remote support: a Hengli service engineer will respond by telephone or email within 4 hours of "
            "your call or email being registered. Most drive faults and parameter questions are solved remotely.",
            "On-site support: if the problem cannot be solved remotely, a service engineer will be on site "
            "within 48 hours in mainland China and in the European Union. For other regions the on-site time "
            "is agreed with the local Hengli service partner.",
            "Emergency breakdowns that stop production are handled with priority. Mention 'line stop' when "
            "you call the hotline.",
        ],
    ),
    (
        "RMA process (returning a product)",
        [
            "1. Contact Hengli service by hotline or email and describe the fault. Quote the serial number.",
            "2. The service engineer carries out remote diagnosis. If a return is necessary, Hengli issues an "
            "RMA number in the format RMA-YYYY-NNNNN (for example RMA-2024-00318).",
            "3. Fill in the RMA form sent with the RMA number: serial number, fault description, operating "
            "hours, fault codes, and whether a warranty claim is made.",
            "4. Pack the product in its original packaging or equivalent. Motors must be shipped with the "
            "shaft locking device fitted. Drives must be packed in antistatic material.",
            "5. Write the RMA number clearly on the outside of the package and ship it within 14 days of the "
            "RMA number being issued. Packages without an RMA number will be refused.",
            "6. Hengli inspects the product within 5 working days of receipt and sends an inspection report. "
            "For warranty cases the repair is free of charge; otherwise a quotation is sent for approval.",
            "7. After repair the product is tested and returned. Standard repair turnaround is 10 working days "
            "after approval.",
        ],
    ),
    (
        "Warranty claims",
        [
            "The standard warranty is 24 months from delivery or 18 months from commissioning, whichever comes "
            "first, and can be extended up to 60 months with the extended warranty option. Warranty claims must "
            "be reported within 30 days of discovering the defect and must include the serial number. See the "
            "Hengli warranty policy for exclusions.",
        ],
    ),
    (
        "Service addresses",
        [
            "Hengli Drives Service Center China, 88 Gongye Road, Changzhou, Jiangsu, China (repair workshop "
            "for all RMA returns from Asia).",
            "Hengli Drives Europe Service, Unit 4, 12 Example Park, London, United Kingdom (repair workshop for "
            "all RMA returns from Europe).",
        ],
    ),
]


def build() -> Path:
    pdf = FPDF(format="A4")
    pdf.set_title(TITLE)
    pdf.set_author("Hengli Drives")
    # Fixed date so that regenerating the file gives identical output.
    pdf.set_creation_date(datetime(2024, 6, 1, tzinfo=UTC))
    pdf.set_auto_page_break(auto=True, margin=18)
    pdf.set_margins(20, 20, 20)
    pdf.add_page()

    pdf.set_font("Helvetica", "B", 16)
    pdf.multi_cell(0, 9, TITLE, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(3)

    for heading, paragraphs in SECTIONS:
        if heading:
            pdf.ln(2)
            pdf.set_font("Helvetica", "B", 12)
            pdf.multi_cell(0, 7, heading, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        pdf.set_font("Helvetica", "", 10.5)
        for para in paragraphs:
            pdf.multi_cell(0, 5.5, para, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(2)

    OUT.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(OUT))
    return OUT


if __name__ == "__main__":
    print(build())
