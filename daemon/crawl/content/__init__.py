"""Content: a fetched body turned into a document (decoding, HTML to markdown, main
content, links, metadata) and PDF text. Above fetching."""
