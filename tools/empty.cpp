// Placeholder translation unit for a pipeline stage that has no sources yet.
