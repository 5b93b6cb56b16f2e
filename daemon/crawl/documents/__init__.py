"""Documents: PDFs (native text and OCR), images and office files made markdown; Firecrawl's
`parsers` and the formats /v2/parse takes. Above content, below options."""
