"""The report's sections, one function each: (ReportData, figures) -> blocks; markdown.SECTIONS orders them."""
