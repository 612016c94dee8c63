CREATE OR REPLACE FUNCTION streamledger_claim_many(
  p_pipeline varchar, p_brokers varchar[], p_streams varchar[], p_super_streams varchar[],
  p_end_limits bigint[], p_dag_id varchar, p_run_id varchar, p_task_id varchar, p_map_index integer,
  p_try_number integer, p_initials bigint[], p_now timestamp, p_max_span bigint,
  p_abandon_before timestamp, p_span_starts bigint[], p_span_ends bigint[], p_interval_starts timestamp[],
  p_interval_ends timestamp[])
RETURNS SETOF streamledger_range LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  FOR i IN 1 .. COALESCE(array_length(p_streams, 1), 0) LOOP
    RETURN QUERY SELECT * FROM streamledger_claim(p_pipeline, p_brokers[i], p_streams[i], p_super_streams[i],
      p_end_limits[i], p_dag_id, p_run_id, p_task_id, p_map_index, p_try_number, p_initials[i], p_now,
      p_max_span, p_abandon_before, p_span_starts[i], p_span_ends[i], p_interval_starts[i],
      p_interval_ends[i]);
  END LOOP;
END;
$$
