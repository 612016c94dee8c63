CREATE TRIGGER streamledger_range_insert_guard BEFORE INSERT ON streamledger_range
WHEN NEW.status <> 'failed'
BEGIN
  SELECT RAISE(ABORT,
                'streamledger: only record-free ranges may be inserted as committed')
    WHERE NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset
      AND (NEW.records IS NOT 0 OR NEW.first_seen IS NOT NULL OR NEW.last_seen IS NOT NULL);
  SELECT RAISE(ABORT, 'streamledger: range does not start at the end of the previous range')
    WHERE (SELECT r.end_offset FROM streamledger_range r
   WHERE r.source_id = NEW.source_id AND r.status <> 'failed'
   ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1) IS NOT NULL AND NEW.start_offset <> (SELECT r.end_offset FROM streamledger_range r
   WHERE r.source_id = NEW.source_id AND r.status <> 'failed'
   ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1) AND NEW.pinned = 0 AND NOT EXISTS (SELECT 1 FROM streamledger_range f
   WHERE f.source_id = NEW.source_id AND f.status = 'failed'
     AND f.start_offset <= NEW.start_offset AND f.end_offset >= NEW.end_offset);
  SELECT RAISE(ABORT, 'streamledger: range overlaps a live range of the same source')
    WHERE NEW.end_offset > NEW.start_offset AND (
      EXISTS (SELECT 1 FROM streamledger_range o
              WHERE o.source_id = NEW.source_id AND o.status <> 'failed' AND o.end_offset > o.start_offset
                AND o.start_offset >= NEW.start_offset AND o.start_offset < NEW.end_offset)
      OR (SELECT p.end_offset FROM streamledger_range p
          WHERE p.source_id = NEW.source_id AND p.status <> 'failed' AND p.end_offset > p.start_offset
            AND p.start_offset < NEW.start_offset
          ORDER BY p.start_offset DESC, p.end_offset DESC LIMIT 1) > NEW.start_offset);
END
