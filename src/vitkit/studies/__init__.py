"""The paper's findings as studies: many training runs, reused when finished, summarised as json, md and png."""
