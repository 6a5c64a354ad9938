"""Raw data: pinned archives, packaged sources, dataset formats, the catalog, the survey and the prompt mixture."""
