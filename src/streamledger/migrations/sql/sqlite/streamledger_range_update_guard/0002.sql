CREATE TRIGGER streamledger_range_update_guard BEFORE UPDATE ON streamledger_range
BEGIN
  SELECT RAISE(ABORT, 'streamledger: the span of a range is immutable')
    WHERE NEW.source_id <> OLD.source_id OR NEW.start_offset <> OLD.start_offset
       OR NEW.end_offset <> OLD.end_offset;
  SELECT RAISE(ABORT, 'streamledger: illegal range status transition')
    WHERE NEW.status <> OLD.status AND NOT (OLD.status = 'claimed' AND NEW.status IN ('committed', 'failed'));
END
