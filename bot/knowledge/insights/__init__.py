"""What the knowledge base is missing: turn records, the report built on them, and the weekly digest."""
