CREATE OR REPLACE FUNCTION streamledger_claim(
  p_pipeline varchar, p_broker varchar, p_stream varchar, p_super_stream varchar,
  p_end_limit bigint, p_dag_id varchar, p_run_id varchar, p_task_id varchar, p_map_index integer,
  p_try_number integer, p_initial bigint, p_now timestamp)
RETURNS SETOF streamledger_range LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  sid bigint;
  pid bigint;
  held streamledger_range;
  made streamledger_range;
  hole_start bigint;
  hole_end bigint;
  tail bigint;
  s bigint;
  e bigint;
BEGIN
  SELECT src.id INTO sid FROM streamledger_source src
    JOIN streamledger_pipeline p ON p.id = src.pipeline_id
   WHERE p.name = p_pipeline AND src.broker = p_broker AND src.stream = p_stream
   FOR UPDATE OF src;
  IF sid IS NULL THEN
    INSERT INTO streamledger_pipeline (name, created_at) VALUES (p_pipeline, p_now)
      ON CONFLICT (name) DO NOTHING;
    SELECT id INTO pid FROM streamledger_pipeline WHERE name = p_pipeline;
    INSERT INTO streamledger_source (pipeline_id, broker, stream, super_stream, created_at)
      VALUES (pid, p_broker, p_stream, p_super_stream, p_now)
      ON CONFLICT (pipeline_id, broker, stream) DO NOTHING;
    SELECT src.id INTO sid FROM streamledger_source src
     WHERE src.pipeline_id = pid AND src.broker = p_broker AND src.stream = p_stream
     FOR UPDATE;
  END IF;

  SELECT * INTO held FROM streamledger_range r
   WHERE r.source_id = sid AND r.dag_id = p_dag_id AND r.run_id = p_run_id AND r.task_id = p_task_id
     AND r.map_index = p_map_index AND r.status IN ('claimed', 'committed');
  IF FOUND THEN
    IF held.status = 'claimed' AND held.try_number <> p_try_number THEN
      UPDATE streamledger_range SET try_number = p_try_number, claimed_at = p_now, updated_at = p_now
       WHERE id = held.id RETURNING * INTO held;
    END IF;
    RETURN NEXT held;
    RETURN;
  END IF;

  SELECT f.start_offset, f.end_offset INTO hole_start, hole_end FROM streamledger_range f
   WHERE f.source_id = sid AND f.status = 'failed' AND f.end_offset > f.start_offset
     AND COALESCE((SELECT l.end_offset FROM streamledger_range l
                    WHERE l.source_id = f.source_id AND l.status <> 'failed'
                      AND l.start_offset < f.end_offset
                    ORDER BY l.start_offset DESC, l.end_offset DESC LIMIT 1), -1) <= f.start_offset
   ORDER BY f.start_offset LIMIT 1;
  IF hole_start IS NOT NULL THEN
    s := hole_start;
    e := hole_end;
  ELSE
    SELECT r.end_offset INTO tail FROM streamledger_range r
     WHERE r.source_id = sid AND r.status <> 'failed'
     ORDER BY r.start_offset DESC, r.end_offset DESC LIMIT 1;
    s := COALESCE(tail, p_initial);
    IF s IS NULL THEN
      RETURN;
    END IF;
    e := GREATEST(s, p_end_limit);
  END IF;

  INSERT INTO streamledger_range (source_id, start_offset, end_offset, status, dag_id, run_id, task_id,
      map_index, try_number, records, first_seen, last_seen, output, offset_stored, offset_verified,
      error, claimed_at, committed_at, updated_at)
    VALUES (sid, s, e, CASE WHEN s = e THEN 'committed' ELSE 'claimed' END, p_dag_id, p_run_id,
      p_task_id, p_map_index, p_try_number, CASE WHEN s = e THEN 0 END, NULL, NULL, NULL, false, false,
      NULL, p_now, CASE WHEN s = e THEN p_now END, p_now)
    RETURNING * INTO made;
  RETURN NEXT made;
END;
$$
