# Stand-ins for the broker classes the plugin sees, with the attributes of
# origin-server's controller/app/plugin_models/*.rb.
class NodeProperties
  attr_accessor :name, :node_consumed_capacity, :district_id, :district_available_capacity, :region_id, :zone_id

  def initialize(name, capacity = nil, district_id = nil, district_available_capacity = nil, region_id = nil, zone_id = nil)
    @name = name
    @node_consumed_capacity = capacity
    @district_id = district_id
    @district_available_capacity = district_available_capacity
    @region_id = region_id
    @zone_id = zone_id
  end
end

class ApplicationProperties
  attr_accessor :id, :name, :web_cartridge, :namespace

  def initialize(id, name, web_cartridge = nil, namespace = 'ns')
    @id = id
    @name = name
    @web_cartridge = web_cartridge
    @namespace = namespace
  end
end

class GearProperties
  attr_accessor :id, :name, :server, :district, :cartridges, :region, :zone

  def initialize(id, name, server, district = nil, cartridges = [])
    @id = id
    @name = name
    @server = server
    @district = district
    @cartridges = cartridges
  end
end

class ComponentProperties
  attr_accessor :cartridge_name, :component_name, :version, :cartridge_vendor

  def initialize(cartridge_name, component_name, version, cartridge_vendor)
    @cartridge_name = cartridge_name
    @component_name = component_name
    @version = version
    @cartridge_vendor = cartridge_vendor
  end
end

class UserProperties
  attr_accessor :id, :login, :consumed_gears, :capabilities, :plan_id, :plan_state

  def initialize(id, login, consumed_gears = 0, capabilities = {}, plan_id = nil, plan_state = nil)
    @id = id
    @login = login
    @consumed_gears = consumed_gears
    @capabilities = capabilities
    @plan_id = plan_id
    @plan_state = plan_state
  end
end

module OpenShift
  # OpenShift's default choice, recorded: the plugin's fallback calls it.
  class MCollectiveApplicationContainerProxy
    class << self
      attr_accessor :calls

      def select_best_fit_node_impl(server_infos)
        (@calls ||= []) << server_infos
        # Like the real one, it reorders and deletes in place.
        server_infos.sort_by! { |s| -s.node_consumed_capacity.to_f }
        server_infos.delete_if { |s| s.district_id.nil? } if server_infos.any?(&:district_id)
        server_infos.last
      end
    end
  end
end
