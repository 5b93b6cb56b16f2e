"""Content: a fetched body turned into a document (decoding, HTML to markdown, main
content, links, metadata). Files (PDFs, images, office documents) are the documents room's.
Above fetching."""
