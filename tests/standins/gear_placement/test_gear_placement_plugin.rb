# The gear-placement plugin (packaging/openshift/gear_placement), loaded with
# stand-in broker classes and a fake gearshift-broker: its choice, the request
# it sends, how it runs the command, and every fallback.
require 'minitest/autorun'
require 'json'
require 'logger'
require 'stringio'
require 'tmpdir'
require 'fileutils'
require 'time'

HERE = File.expand_path(__dir__)
ROOT = File.expand_path('../../..', HERE)
PLUGIN_DIR = File.join(ROOT, 'packaging/openshift/gear_placement')
FAKE = File.join(HERE, 'fake-gearshift-broker')
$LOAD_PATH.unshift(File.join(HERE, 'stub_lib'))
require File.join(HERE, 'stubs')
require File.join(PLUGIN_DIR, 'lib/openshift/gear_placement_plugin')

class GearPlacementPluginTest < Minitest::Test
  P = OpenShift::GearPlacementPlugin

  def setup
    @dir = Dir.mktmpdir('gear-placement-')
    @record = File.join(@dir, 'record.json')
    @log = StringIO.new
    P.logger = Logger.new(@log)
    OpenShift::MCollectiveApplicationContainerProxy.calls = []
    fake('least')
    @nodes = [NodeProperties.new('node-1.example.com', 42.0, 'd1', 5000),
              NodeProperties.new('node-2.example.com', 10.5, 'd1', 5000, 'east', 'east-1a'),
              NodeProperties.new('node-3.example.com', 77.0, 'd1', 5000)]
    @app = ApplicationProperties.new('a1', 'shop', 'php-5.4')
    @gears = [GearProperties.new('g1', 'shop', 'node-1.example.com', 'd1', ['php-5.4']),
              GearProperties.new('g2', 'shop', nil)]
    @comps = [ComponentProperties.new('php-5.4', 'php', '5.4', 'redhat')]
    @user = UserProperties.new('u1', 'alice', 3, { 'max_gears' => 10 }, 'free', 'active')
    @time = Time.utc(2026, 11, 22, 10, 0, 0.25)
  end

  def teardown
    FileUtils.rm_rf(@dir)
    P.settings_override = nil
  end

  def fake(mode, extra = {})
    P.settings_override = { :gearshift_command => FAKE,
                            :gearshift_args => ['place', '--input', '-', '--json', '--mode', mode, '--record', @record],
                            :gearshift_timeout => 5.0 }.merge(extra)
  end

  def place(nodes = @nodes, app = @app, user = @user)
    P.select_best_fit_node_impl(nodes, app, @gears, @comps, user, @time)
  end

  def recorded
    JSON.parse(File.read(@record))
  end

  def default_calls
    OpenShift::MCollectiveApplicationContainerProxy.calls
  end

  # The choice and the request.

  def test_returns_the_entry_gearshift_names
    chosen = place
    assert_same @nodes[1], chosen
    assert_empty default_calls
    assert_match(/gearshift placement: node-2.example.com \(strategy fake, 3 candidates of 3\)/, @log.string)
  end

  def test_request_is_a_placement_request_body
    place
    req = JSON.parse(recorded['stdin'])
    assert_equal %w[app components current_gears nodes request_time user], req.keys.sort
    assert_equal({ 'name' => 'node-2.example.com', 'node_consumed_capacity' => 10.5, 'active' => true,
                   'district_id' => 'd1', 'district_available_capacity' => 5000,
                   'region_id' => 'east', 'zone_id' => 'east-1a' }, req['nodes'][1])
    assert_equal({ 'name' => 'node-1.example.com', 'node_consumed_capacity' => 42.0, 'active' => true,
                   'district_id' => 'd1', 'district_available_capacity' => 5000 }, req['nodes'][0])
    assert_equal({ 'id' => 'a1', 'name' => 'shop', 'web_cartridge' => 'php-5.4' }, req['app'])
    assert_equal [{ 'id' => 'g1', 'name' => 'shop', 'server' => 'node-1.example.com',
                    'cartridges' => ['php-5.4'], 'district' => 'd1' }], req['current_gears']
    assert_equal [{ 'cartridge_name' => 'php-5.4', 'component_name' => 'php', 'version' => '5.4',
                    'cartridge_vendor' => 'redhat' }], req['components']
    assert_equal({ 'id' => 'u1', 'login' => 'alice', 'consumed_gears' => 3,
                   'capabilities' => { 'max_gears' => 10 }, 'plan_id' => 'free', 'plan_state' => 'active' },
                 req['user'])
    assert_equal '2026-11-22T10:00:00.250Z', req['request_time']
    refute req.key?('strategy')
  end

  def test_strategy_and_odd_values
    fake('least', :gearshift_strategy => 'least-consumed')
    nodes = [NodeProperties.new('a', Float::NAN), NodeProperties.new('b', nil, nil, -5)]
    assert_same nodes[1], place(nodes, nil, nil)
    req = JSON.parse(recorded['stdin'])
    assert_equal 'least-consumed', req['strategy']
    assert_equal [100.0, 0.0], req['nodes'].map { |n| n['node_consumed_capacity'] }
    assert_equal 0, req['nodes'][1]['district_available_capacity']
    assert_equal({ 'id' => '', 'name' => '' }, req['app'])
    assert_equal({ 'id' => '', 'login' => '' }, req['user'])
  end

  def test_request_time_is_not_modified
    local = Time.new(2026, 11, 22, 12, 0, 0, '+02:00')
    P.select_best_fit_node_impl(@nodes, @app, @gears, @comps, @user, local)
    assert_equal '2026-11-22T10:00:00.000Z', JSON.parse(recorded['stdin'])['request_time']
    assert_equal 7200, local.utc_offset
  end

  def test_arguments_reach_the_command_literally_and_env_is_passed
    marker = File.join(@dir, 'pwned')
    fake('least', :gearshift_args => "place --input - --json --mode least --record #{@record} " \
                                     "--from 'paas broker' '$(touch #{marker})' ';' '|'",
                  :gearshift_env => { 'GEARSHIFT_BUS' => 'amqp://x/%2f', :GEARSHIFT_OPERATOR_KEY => '/k' })
    assert_same @nodes[1], place
    r = recorded
    assert_equal ['--from', 'paas broker', "$(touch #{marker})", ';', '|'], r['rest'][4..-1]
    refute File.exist?(marker)
    assert_equal 'amqp://x/%2f', r['env']['GEARSHIFT_BUS']
    assert_equal '/k', r['env']['GEARSHIFT_OPERATOR_KEY']
  end

  def test_large_request_is_written_without_blocking
    nodes = (1..3000).map { |i| NodeProperties.new("node-#{i}.example.com", (i * 7) % 100, 'd1', 5000) }
    chosen = place(nodes)
    assert_equal 'node-100.example.com', chosen.name
    assert_operator recorded['stdin'].bytesize, :>, 200_000
  end

  def test_command_that_does_not_read_its_input
    nodes = (1..3000).map { |i| NodeProperties.new("node-#{i}.example.com", 50.0) }
    fake('deaf', :gearshift_args => ['place', '--input', '-', '--json', '--mode', 'deaf', '--node', 'node-7.example.com'])
    assert_equal 'node-7.example.com', place(nodes).name
  end

  def test_settings_from_the_broker_configuration
    P.settings_override = nil
    Object.const_set(:Broker, Module.new)
    app = Class.new
    cfg = Struct.new(:gear_placement).new({ :gearshift_command => FAKE,
                                            :gearshift_args => ['place', '--input', '-', '--json', '--mode', 'ok:node-3.example.com'],
                                            :unrelated => 1 })
    app.define_singleton_method(:config) { cfg }
    Broker.const_set(:Application, app)
    assert_same @nodes[2], place
    assert_equal FAKE, P.settings[:gearshift_command]
    refute P.settings.key?(:unrelated)
    assert_equal 5.0, P.settings[:gearshift_timeout]
  ensure
    Object.send(:remove_const, :Broker) if defined?(Broker)
  end

  # Every fallback: OpenShift's default choice, with the reason logged.

  def assert_falls_back(expected_log)
    original = @nodes.dup
    chosen = place
    assert_equal 1, default_calls.length, 'the default choice was asked'
    refute_same @nodes, default_calls[0], 'the default choice gets a copy'
    assert_equal original, @nodes, 'the broker\'s list is left as it was'
    assert_same @nodes[1], chosen
    assert_match expected_log, @log.string
    assert_match(/falling back to OpenShift's default choice/, @log.string)
  end

  def test_fallback_on_refusal
    fake('refuse:no node has room')
    assert_falls_back(/exited with 2: refused: no node has room/)
  end

  def test_fallback_on_error_exit
    fake('exit:1')
    assert_falls_back(/exited with 1: bus: connection refused/)
  end

  def test_fallback_on_timeout_kills_the_command
    fake('sleep:30', :gearshift_timeout => 0.5)
    started = Time.now
    assert_falls_back(/no answer within 0.5 s \(command killed\)/)
    assert_operator Time.now - started, :<, 5
    pid = recorded['pid']
    assert_raises(Errno::ESRCH) { Process.kill(0, pid) }
  end

  def test_fallback_on_bad_json
    fake('garbage')
    assert_falls_back(/reply is not a JSON object: "node-1.example.com\\n"/)
  end

  def test_fallback_on_json_that_is_not_an_object
    fake('array')
    assert_falls_back(/reply is not a JSON object/)
  end

  def test_fallback_on_reply_without_node
    fake('nonode')
    assert_falls_back(/reply names no node/)
  end

  def test_fallback_on_node_not_among_candidates
    fake('ok:node-9.example.com')
    assert_falls_back(/reply names "node-9.example.com", which is not among the candidates/)
  end

  def test_fallback_on_oversized_answer
    fake('big')
    assert_falls_back(/answer larger than 1048576 bytes/)
  end

  def test_fallback_when_the_command_cannot_run
    fake('least', :gearshift_command => File.join(@dir, 'missing'))
    assert_falls_back(/cannot run .*missing: No such file or directory/)
  end

  def test_fallback_on_unexpected_error
    fake('least', :gearshift_args => 'place "unterminated')
    assert_falls_back(/ArgumentError: Unmatched/)
  end

  def test_no_candidates_asks_nobody
    chosen = P.select_best_fit_node_impl([], @app, @gears, @comps, @user, @time)
    assert_nil chosen
    refute File.exist?(@record)
    assert_match(/no candidate nodes to send/, @log.string)
  end

  def test_without_the_broker_default_the_least_consumed_is_taken
    fake('exit:1')
    saved = OpenShift.send(:remove_const, :MCollectiveApplicationContainerProxy)
    begin
      assert_same @nodes[1], place
    ensure
      OpenShift.const_set(:MCollectiveApplicationContainerProxy, saved)
    end
  end
end

# The initializer turns the example .conf into the plugin's settings.
class GearPlacementInitializerTest < Minitest::Test
  def test_example_conf_maps_to_settings
    Dir.mktmpdir do |dir|
      FileUtils.cp(File.join(PLUGIN_DIR, 'conf/openshift-origin-gear-placement.conf.example'),
                   File.join(dir, 'openshift-origin-gear-placement.conf'))
      cfg = load_initializer(dir)
      assert_equal '/usr/bin/gearshift-broker', cfg[:gearshift_command]
      assert_equal 'place --input - --json --timeout 4s --from paas-broker', cfg[:gearshift_args]
      assert_equal 5.0, cfg[:gearshift_timeout]
      assert_nil cfg[:gearshift_strategy]
      assert_equal false, cfg[:gearshift_log_requests]
      assert_equal({ 'GEARSHIFT_OPERATOR_KEY' => '/etc/gearshift/paas-broker.key',
                     'GEARSHIFT_BROKER_PUB' => '/etc/gearshift/broker.pub' }, cfg[:gearshift_env])
      assert_equal OpenShift::GearPlacementPlugin::DEFAULTS.keys.sort - [:gearshift_max_output], cfg.keys.sort
    end
  end

  def load_initializer(dir)
    settings = {}
    config = Object.new
    config.define_singleton_method(:gear_placement=) { |v| settings.replace(v) }
    # Rails evaluates a configure block on the application, whose #config is the configuration.
    app = Module.new
    app.define_singleton_method(:config) { config }
    app.define_singleton_method(:configure) { |&blk| app.instance_eval(&blk) }
    Object.const_set(:Broker, Module.new) unless defined?(Broker)
    Broker.const_set(:Application, app)
    rails = Module.new
    env = Object.new
    env.define_singleton_method(:development?) { false }
    rails.define_singleton_method(:env) { env }
    Object.const_set(:Rails, rails)
    require 'openshift-origin-common'
    OpenShift::Config.send(:remove_const, :PLUGINS_DIR)
    OpenShift::Config.const_set(:PLUGINS_DIR, dir)
    load File.join(PLUGIN_DIR, 'config/initializers/openshift-origin-gear-placement.rb')
    settings
  ensure
    Object.send(:remove_const, :Broker) if defined?(Broker)
    Object.send(:remove_const, :Rails) if defined?(Rails)
  end
end
