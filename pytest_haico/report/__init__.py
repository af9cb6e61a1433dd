"""What a campaign's records show: the report's figures (terminal and HTML), the comparison
of two runs, and the cost model that sizes the next submission."""
