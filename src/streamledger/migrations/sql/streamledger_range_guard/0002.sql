CREATE OR REPLACE FUNCTION streamledger_range_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  tail bigint;
BEGIN
  IF TG_OP = 'UPDATE' THEN
    IF NEW.source_id <> OLD.source_id OR NEW.start_offset <> OLD.start_offset
       OR NEW.end_offset <> OLD.end_offset THEN
      RAISE EXCEPTION 'streamledger: the span of range % is immutable', OLD.id
        USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status <> OLD.status
       AND NOT (OLD.status = 'claimed' AND NEW.status IN ('committed', 'failed')) THEN
      RAISE EXCEPTION 'streamledger: range % cannot move from % to %', OLD.id, OLD.status, NEW.status
        USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
  END IF;
  IF NEW.status = 'failed' THEN
    RETURN NEW;
  END IF;
  IF NEW.status = 'committed' AND NEW.end_offset > NEW.start_offset THEN
    RAISE EXCEPTION 'streamledger: only empty ranges may be inserted as committed'
      USING ERRCODE = 'check_violation';
  END IF;
  tail := (SELECT r.end_offset FROM streamledger_range r
   WHERE r.source_id = NEW.source_id AND r.status <> 'failed'
   ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1);
  IF tail IS NOT NULL AND NEW.start_offset <> tail AND NOT EXISTS (SELECT 1 FROM streamledger_range f
   WHERE f.source_id = NEW.source_id AND f.status = 'failed'
     AND f.start_offset = NEW.start_offset AND f.end_offset >= NEW.end_offset) THEN
    RAISE EXCEPTION 'streamledger: range [%, %) of source % does not start where the live ranges end (%)',
      NEW.start_offset, NEW.end_offset, NEW.source_id, tail USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END;
$$
