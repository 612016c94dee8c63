SELECT offset, stream FROM records
